"""Import HuggingFace T5 checkpoints (config.json + safetensors) into our parameter tree.

Tensors come from safetensors, or from a `pytorch_model.bin` through torch's weights-only
unpickler (`read_tensors`), so nothing in a checkpoint can execute code. Every tensor of the
file must be used and every parameter of the model must be found: an unknown, missing or
mis-shaped tensor is an error that names it.

The tied/untied question follows what the checkpoint means, across transformers versions:
v1.0 checkpoints scale the decoder output by d_model**-0.5 and reuse `shared.weight` as the
output layer; v1.1 checkpoints carry a separate `lm_head.weight` and no scaling. transformers
5.x writes `tie_word_embeddings: true` for both and marks v1.1 with `scale_decoder_outputs:
false`; older versions write `tie_word_embeddings: false` for v1.1.
"""

from __future__ import annotations

import json
import os
import pickle
from typing import Any, Callable, Iterator

import numpy as np

from t5x_like import logs
from t5x_like.checkpoints import hf_families
from t5x_like.errors import CheckpointError
from t5x_like.families.t5.network import T5Config

Tensor = np.ndarray
Params = dict[str, Any]


# ------------------------------------------------------------------------------ config
_ACTIVATIONS = {
    "relu": ("relu",),
    "gated-gelu": ("gelu", "linear"),  # HF maps this to gelu_new, the tanh approximation
    "gated-gelu_new": ("gelu", "linear"),
    "gated-relu": ("relu", "linear"),
    "gelu_new": ("gelu",),
}


def scales_decoder_outputs(hf_config: dict[str, Any]) -> bool:
    """True for the v1.0 layout (tied output with d_model**-0.5 scaling)."""
    if "scale_decoder_outputs" in hf_config:
        return bool(hf_config["scale_decoder_outputs"])
    return hf_config.get("tie_word_embeddings", True) is not False


def config_from_hf(hf_config: dict[str, Any]) -> T5Config:
    """Our T5Config for a HuggingFace `config.json` dictionary."""
    proj = hf_config.get("feed_forward_proj", "relu")
    if proj not in _ACTIVATIONS:
        raise CheckpointError(
            f"config.json feed_forward_proj={proj!r} is not supported; "
            f"supported: {sorted(_ACTIVATIONS)}."
        )
    num_layers = hf_config.get("num_layers", 6)
    return T5Config(
        vocab_size=hf_config.get("vocab_size", 32128),
        emb_dim=hf_config.get("d_model", 512),
        num_heads=hf_config.get("num_heads", 8),
        head_dim=hf_config.get("d_kv", 64),
        mlp_dim=hf_config.get("d_ff", 2048),
        num_encoder_layers=num_layers,
        num_decoder_layers=hf_config.get("num_decoder_layers") or num_layers,
        mlp_activations=_ACTIVATIONS[proj],
        dropout_rate=hf_config.get("dropout_rate", 0.1),
        logits_via_embedding=scales_decoder_outputs(hf_config),
        relative_attention_num_buckets=hf_config.get("relative_attention_num_buckets", 32),
        relative_attention_max_distance=hf_config.get("relative_attention_max_distance", 128),
        layer_norm_epsilon=hf_config.get("layer_norm_epsilon", 1e-6),
    )


# ------------------------------------------------------------------------------ name map
# Each parameter's transform is a pair (HF -> ours, ours -> HF), so one table serves import
# and export (hf_bert uses the same pairs).
Transform = Callable[[Tensor], Tensor]
TransformPair = tuple[Transform, Transform]


def same() -> TransformPair:
    return (lambda w: w), (lambda w: w)


def transposed() -> TransformPair:
    """torch Linear weight [out, in] <-> our kernel [in, out]."""
    return (lambda w: w.T), (lambda w: w.T)


def to_heads(heads: tuple[int, int]) -> TransformPair:
    """torch Linear weight [out=heads*d_head, in] <-> our kernel [in, heads, d_head]."""
    return (lambda w: w.T.reshape(-1, *heads)), (lambda k: k.reshape(k.shape[0], -1).T)


def from_heads(heads: tuple[int, int]) -> TransformPair:
    """torch Linear weight [out, in=heads*d_head] <-> our kernel [heads, d_head, out]."""
    return (lambda w: w.T.reshape(*heads, -1)), (lambda k: k.reshape(-1, k.shape[-1]).T)


def name_map(cfg: T5Config) -> Iterator[tuple[str, tuple[str, ...], TransformPair]]:
    """(HF tensor name, our parameter path, transform pair) for every parameter, our layers
    in the per-layer layout."""
    heads = (cfg.num_heads, cfg.head_dim)
    yield "shared.weight", ("token_embedder", "embedding"), same()

    def attention(hf_prefix: str, ours: tuple[str, ...]):
        for hf, name in (("q", "query"), ("k", "key"), ("v", "value")):
            yield f"{hf_prefix}.{hf}.weight", (*ours, name, "kernel"), to_heads(heads)
        yield f"{hf_prefix}.o.weight", (*ours, "out", "kernel"), from_heads(heads)

    def mlp(hf_prefix: str, ours: tuple[str, ...]):
        names = (
            ["wi"]
            if len(cfg.mlp_activations) == 1
            else [f"wi_{i}" for i in range(len(cfg.mlp_activations))]
        )
        for name in names:
            yield f"{hf_prefix}.{name}.weight", (*ours, "mlp", name, "kernel"), transposed()
        yield f"{hf_prefix}.wo.weight", (*ours, "mlp", "wo", "kernel"), transposed()

    for stack, n_layers in (
        ("encoder", cfg.num_encoder_layers),
        ("decoder", cfg.num_decoder_layers),
    ):
        yield (
            f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
            (stack, "relpos_bias", "rel_embedding"),
            transposed(),
        )
        for i in range(n_layers):
            hf = f"{stack}.block.{i}.layer"
            ours = (stack, f"layers_{i}")
            if stack == "encoder":
                yield from attention(f"{hf}.0.SelfAttention", (*ours, "attention"))
                yield (
                    f"{hf}.0.layer_norm.weight",
                    (*ours, "pre_attention_layer_norm", "scale"),
                    same(),
                )
                yield from mlp(f"{hf}.1.DenseReluDense", ours)
                yield (f"{hf}.1.layer_norm.weight", (*ours, "pre_mlp_layer_norm", "scale"), same())
            else:
                yield from attention(f"{hf}.0.SelfAttention", (*ours, "self_attention"))
                yield (
                    f"{hf}.0.layer_norm.weight",
                    (*ours, "pre_self_attention_layer_norm", "scale"),
                    same(),
                )
                yield from attention(
                    f"{hf}.1.EncDecAttention", (*ours, "encoder_decoder_attention")
                )
                yield (
                    f"{hf}.1.layer_norm.weight",
                    (*ours, "pre_cross_attention_layer_norm", "scale"),
                    same(),
                )
                yield from mlp(f"{hf}.2.DenseReluDense", ours)
                yield (f"{hf}.2.layer_norm.weight", (*ours, "pre_mlp_layer_norm", "scale"), same())
        norm = "encoder_norm" if stack == "encoder" else "decoder_norm"
        yield f"{stack}.final_layer_norm.weight", (stack, norm, "scale"), same()
    if not cfg.logits_via_embedding:
        yield "lm_head.weight", ("decoder", "logits_dense", "kernel"), transposed()


# Copies of `shared.weight` that some writers store; accepted only when equal to it.
_TIED_ALIASES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")


# ------------------------------------------------------------------------------ reading
def _read_json(path: str, what: str) -> dict[str, Any]:
    """A JSON object from `path`; unreadable, not JSON or not an object is a CheckpointError
    naming the file (and the line and column of a syntax error)."""
    try:
        with open(path, "rb") as f:
            value = json.loads(f.read().decode("utf-8"))
    except CheckpointError:
        raise
    except OSError as e:
        raise CheckpointError(f"{path} cannot be read ({e.strerror or e}); {what}") from None
    except UnicodeDecodeError as e:
        raise CheckpointError(
            f"{path} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); {what}"
        ) from None
    except json.JSONDecodeError as e:
        raise CheckpointError(
            f"{path}:{e.lineno}: not valid JSON ({e.msg} at column {e.colno}); {what}"
        ) from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path} holds a JSON {type(value).__name__}, not an object; {what}")
    return value


def shard_files(checkpoint_dir: str, index_name: str) -> list[str]:
    """The shard file names a sharded checkpoint's index (`model.safetensors.index.json` or
    `pytorch_model.bin.index.json`) lists, every one checked to be present before any is
    read: a partial download is named, not a traceback halfway through the tensors."""
    index_path = os.path.join(checkpoint_dir, index_name)
    redo = (
        "re-download or re-save the checkpoint (transformers' save_pretrained writes it "
        "with its shards)."
    )
    weight_map = _read_json(index_path, redo).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(
            f"{index_path} has no 'weight_map' of tensor names to shard files; {redo}"
        )
    files = sorted(set(map(str, weight_map.values())))
    missing = [n for n in files if not os.path.isfile(os.path.join(checkpoint_dir, n))]
    if missing:
        raise CheckpointError(
            f"{index_path} lists {len(files)} shard(s), but {len(missing)} are not in "
            f"{checkpoint_dir}: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}. "
            "The download is incomplete: fetch the missing file(s) again (e.g. "
            "`huggingface-cli download REPO --local-dir DIR`)."
        )
    return files


def read_safetensors(checkpoint_dir: str) -> dict[str, Tensor]:
    """All tensors of a (possibly sharded) safetensors checkpoint, as float32 numpy arrays."""
    from safetensors import safe_open  # local import: only conversion needs it

    index_name = "model.safetensors.index.json"
    if os.path.exists(os.path.join(checkpoint_dir, index_name)):
        files = shard_files(checkpoint_dir, index_name)
    elif os.path.exists(os.path.join(checkpoint_dir, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        raise CheckpointError(
            f"No model.safetensors, model.safetensors.index.json or "
            f"pytorch_model.bin in {checkpoint_dir}; a HuggingFace "
            "checkpoint directory holds config.json and its weights."
        )
    paths = [os.path.join(checkpoint_dir, name) for name in files]
    total_bytes = sum(map(_safetensors_data_bytes, paths))  # every shard checked before any read
    tensors: dict[str, Tensor] = {}
    with _read_progress(total_bytes) as bar:
        for path in paths:
            try:
                # framework="flax" reads bfloat16 too, which plain numpy cannot represent.
                with safe_open(path, framework="flax") as f:
                    for key in f.keys():
                        stored = f.get_tensor(key)
                        tensors[key] = np.asarray(stored, dtype=np.float32)
                        bar.update(stored.nbytes)
            except Exception as e:  # noqa: BLE001 - SafetensorError, OSError: truncated
                raise CheckpointError(
                    f"{path} is not a readable safetensors file "
                    f"({str(e).splitlines()[0][:200]}); it may be truncated: fetch it again."
                ) from None
    return tensors


# safetensors' own limit on the JSON header (its MAX_HEADER_SIZE): a larger length is damage.
_MAX_SAFETENSORS_HEADER = 100_000_000


def _safetensors_data_bytes(path: str) -> int:
    """The bytes of tensor data a safetensors file's header promises (the format: an 8-byte
    little-endian header length, a JSON header of `data_offsets`, then the data), checked
    against the file's size, so a cut-off download is named before any shard is read and a bar
    over the data ends at exactly 100%."""
    unreadable = (
        f"{path} is not a readable safetensors file ({{}}); it may be truncated: fetch it again."
    )
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            prefix = f.read(8)
            header_bytes = int.from_bytes(prefix, "little")
            if len(prefix) < 8 or 8 + header_bytes > size or header_bytes > _MAX_SAFETENSORS_HEADER:
                raise CheckpointError(
                    unreadable.format(f"{size} bytes; its header length says {header_bytes}")
                )
            header = json.loads(f.read(header_bytes))
        data = max(
            (
                int(entry["data_offsets"][1])
                for name, entry in header.items()
                if name != "__metadata__"
            ),
            default=0,
        )
    except CheckpointError:
        raise
    except OSError as e:
        raise CheckpointError(
            f"{path} cannot be read ({e.strerror or e}); check the file and "
            "its permissions, or fetch it again."
        ) from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError):
        raise CheckpointError(unreadable.format("its header is not safetensors JSON")) from None
    if 8 + header_bytes + data > size:
        raise CheckpointError(
            unreadable.format(
                f"it holds {size - 8 - header_bytes} of the {data} bytes of tensor data its "
                "header lists"
            )
        )
    return data


def _read_progress(total_bytes: int):
    """The bar a conversion's read shows: bytes read of the checkpoint, with rate and ETA (an
    11B model is 45 GB; its read is where a conversion spends its time)."""
    return logs.progress(
        desc="convert read", total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024
    )


def _torch_load(path: str) -> dict[str, Tensor]:
    """One PyTorch file's tensors through torch's weights-only unpickler."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:  # the weights-only unpickler met something else
        raise CheckpointError(
            f"{path} was not loaded: it holds more than tensors (torch's weights-only "
            f"loader refused it: {str(e).splitlines()[0][:200]}), and unpickling such a file "
            "could run code. Use a safetensors copy of the checkpoint."
        ) from None
    except Exception as e:  # noqa: BLE001 - RuntimeError, EOFError, ...: not a whole file
        raise CheckpointError(
            f"{path} is not a readable PyTorch file ({str(e).splitlines()[0][:200]}); it may "
            "be truncated: fetch it again, or use a safetensors copy of the checkpoint."
        ) from None
    return {k: v.float().numpy() for k, v in state.items()}


def read_tensors(checkpoint_dir: str) -> dict[str, Tensor]:
    """A checkpoint's tensors: safetensors, or else a PyTorch `pytorch_model.bin` (or the
    shards its `pytorch_model.bin.index.json` lists) read with torch's weights-only
    unpickler, which builds tensors and plain containers and refuses anything else, so
    nothing in the file can run code."""
    bin_index = "pytorch_model.bin.index.json"
    bin_path = os.path.join(checkpoint_dir, "pytorch_model.bin")
    has_safetensors = any(n.startswith("model.safetensors") for n in os.listdir(checkpoint_dir))
    has_bin_index = os.path.exists(os.path.join(checkpoint_dir, bin_index))
    if has_safetensors or not (os.path.exists(bin_path) or has_bin_index):
        return read_safetensors(checkpoint_dir)
    files = shard_files(checkpoint_dir, bin_index) if has_bin_index else ["pytorch_model.bin"]
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise CheckpointError(
            f"{bin_path} is a PyTorch pickle file; reading it safely needs "
            "torch (pip install torch==2.13.0), or convert it to safetensors "
            "with transformers' save_pretrained(...)."
        ) from e
    paths = [os.path.join(checkpoint_dir, name) for name in files]
    tensors: dict[str, Tensor] = {}
    with _read_progress(sum(map(os.path.getsize, paths))) as bar:
        for path in paths:  # torch reads a file whole, so the bar moves a file at a time
            tensors.update(_torch_load(path))
            bar.update(os.path.getsize(path))
    return tensors


def read_config(checkpoint_dir: str) -> dict[str, Any]:
    """The checkpoint's config.json as a dictionary; a missing, unreadable or malformed file
    is a CheckpointError naming it."""
    path = os.path.join(checkpoint_dir, "config.json")
    if not os.path.exists(path):
        raise CheckpointError(
            f"No config.json in {checkpoint_dir}; a HuggingFace checkpoint "
            "directory holds config.json and model.safetensors."
        )
    return _read_json(
        path,
        "it should be the config.json transformers' save_pretrained writes: fetch or re-save it.",
    )


def params_from_hf(tensors: dict[str, Tensor], cfg: T5Config) -> Params:
    """Our nested parameter dict from HF tensors; errors name the offending tensor."""
    tensors = dict(tensors)
    shared = tensors.get("shared.weight")
    if shared is None:
        for alias in _TIED_ALIASES:  # some exports keep only a stack's copy
            if alias in tensors:
                shared = tensors["shared.weight"] = tensors[alias]
                break
    for alias in _TIED_ALIASES:
        if alias in tensors:
            if shared is None or not np.array_equal(tensors[alias], shared):
                raise CheckpointError(
                    f"Tensor {alias} differs from shared.weight; T5 shares one "
                    "embedding between encoder and decoder."
                )
            del tensors[alias]
    if cfg.logits_via_embedding and "lm_head.weight" in tensors:
        if shared is None or not np.array_equal(tensors["lm_head.weight"], shared):
            raise CheckpointError(
                "Tensor lm_head.weight differs from shared.weight, but config.json describes the "
                "tied v1.0 layout (decoder outputs scaled by d_model**-0.5). Set "
                "scale_decoder_outputs=false / tie_word_embeddings=false for a v1.1 checkpoint."
            )
        del tensors["lm_head.weight"]

    params: Params = {}
    missing = []
    for hf_name, path, (to_ours, _) in name_map(cfg):
        if hf_name not in tensors:
            missing.append(hf_name)
            continue
        value = to_ours(tensors.pop(hf_name))
        node = params
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    if missing:
        raise CheckpointError(
            f"Missing tensor(s) in the checkpoint: {', '.join(missing[:10])}"
            + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
        )
    if tensors:
        raise CheckpointError(
            f"Unknown tensor(s) in the checkpoint: "
            f"{', '.join(sorted(tensors)[:10])} — is this a T5 checkpoint of "
            "the size config.json describes?"
        )
    return params


def check_shapes(params: Params, expected: Params, cfg: T5Config) -> None:
    """Compare imported shapes with the model's; the error names the HF tensor."""
    import jax

    flat = {
        tuple(k.key for k in path): v for path, v in jax.tree_util.tree_leaves_with_path(params)
    }
    want = {
        tuple(k.key for k in path): v for path, v in jax.tree_util.tree_leaves_with_path(expected)
    }
    for hf_name, path, _ in name_map(cfg):
        if tuple(flat[path].shape) != tuple(want[path].shape):
            raise CheckpointError(
                f"Tensor {hf_name} gives shape {tuple(flat[path].shape)} for {'/'.join(path)}, "
                f"but config.json implies {tuple(want[path].shape)}."
            )


def load_hf_checkpoint(checkpoint_dir: str) -> tuple[T5Config, Params]:
    """(config, params) from a HuggingFace T5 directory, shapes checked against the config."""
    from t5x_like.families.t5.model import EncoderDecoderModel, unbox

    hf_config = read_config(checkpoint_dir)
    cfg = config_from_hf(hf_config)
    params = params_from_hf(read_tensors(checkpoint_dir), cfg)
    expected = unbox(EncoderDecoderModel(cfg).abstract_params())
    check_shapes(params, expected, cfg)
    return cfg, params


# ------------------------------------------------------------------------------ export
def hf_config(cfg: T5Config) -> dict[str, Any]:
    """config.json for transformers' T5ForConditionalGeneration (the inverse of
    `config_from_hf`), written so that both transformers 4.x and 5.x read the output layer the
    way the model uses it."""
    proj = {v: k for k, v in _ACTIVATIONS.items() if k != "gated-gelu_new"}
    if cfg.mlp_activations not in proj:
        raise CheckpointError(
            f"transformers' T5 has no feed-forward layer for activations "
            f"{cfg.mlp_activations}; supported: {sorted(proj)}."
        )
    if cfg.shared_encoder_decoder:
        raise CheckpointError(
            "transformers' T5 has no shared encoder-decoder; this checkpoint "
            "stays in this codebase's format."
        )
    return {
        "architectures": ["T5ForConditionalGeneration"],
        "model_type": "t5",
        "vocab_size": cfg.vocab_size,
        "d_model": cfg.emb_dim,
        "num_heads": cfg.num_heads,
        "d_kv": cfg.head_dim,
        "d_ff": cfg.mlp_dim,
        "num_layers": cfg.num_encoder_layers,
        "num_decoder_layers": cfg.num_decoder_layers,
        "feed_forward_proj": proj[cfg.mlp_activations],
        "dropout_rate": cfg.dropout_rate,
        "relative_attention_num_buckets": cfg.relative_attention_num_buckets,
        "relative_attention_max_distance": cfg.relative_attention_max_distance,
        "layer_norm_epsilon": cfg.layer_norm_epsilon,
        "tie_word_embeddings": cfg.logits_via_embedding,
        "scale_decoder_outputs": cfg.logits_via_embedding,
        "is_encoder_decoder": True,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "decoder_start_token_id": 0,
    }


def params_to_hf(params: Params, cfg: T5Config) -> dict[str, Tensor]:
    """HF tensors from our parameters (either layer layout)."""
    from t5x_like.checkpoints import scan_layout

    params = scan_layout.unstack_layers(params)
    out = {}
    for hf_name, path, (_, to_hf) in name_map(cfg):
        node = params
        for key in path:
            node = node[key]
        out[hf_name] = np.ascontiguousarray(to_hf(np.asarray(node, np.float32)))
    return out


def save_hf_checkpoint(directory: str, params: Params, cfg: T5Config) -> None:
    """config.json + model.safetensors that transformers loads as T5ForConditionalGeneration."""
    from safetensors.numpy import save_file

    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(hf_config(cfg), f, indent=2)
    save_file(
        params_to_hf(params, cfg),
        os.path.join(directory, "model.safetensors"),
        metadata={"format": "pt"},
    )


# ------------------------------------------------------------------------- registration
def verify(checkpoint_dir: str, cfg: T5Config, params: Params) -> dict[str, float]:
    """Our model and transformers' on the same batch: the largest differences."""
    from t5x_like.checkpoints import hf_reference

    return hf_reference.max_abs_differences(
        hf_reference.load_hf_model(checkpoint_dir),
        cfg,
        params,
        hf_reference.example_batch(cfg.vocab_size),
    )


def export(
    directory: str, params: Params, cfg: T5Config, architecture: str | None = None
) -> tuple[Callable[[], object], str]:
    del architecture  # one architecture: the text-to-text model
    return lambda: save_hf_checkpoint(directory, params, cfg), "T5ForConditionalGeneration"


HUGGINGFACE = hf_families.register(
    hf_families.HuggingFaceFamily(("t5",), T5Config, load_hf_checkpoint, verify, export)
)
