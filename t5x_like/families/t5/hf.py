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
from typing import Any, Callable, Iterator

import jax.numpy as jnp
import numpy as np

from t5x_like.checkpoints import hf_families, hf_files
from t5x_like.checkpoints.hf_files import (
    TransformPair,
    from_heads,
    read_config,
    read_tensors,
    same,
    to_heads,
    transposed,
)
from t5x_like.errors import CheckpointError
from t5x_like.families.t5.model import EncoderDecoderModel
from t5x_like.families.t5.network import T5Config, Transformer

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
    return from_hf_tensors(read_config(checkpoint_dir), read_tensors(checkpoint_dir))


def from_hf_tensors(
    hf_config: dict[str, Any], tensors: dict[str, Tensor]
) -> tuple[T5Config, Params]:
    """(config, params) from a config in HF's keys and tensors under HF's names (a HuggingFace
    directory's, or a Mesh-TensorFlow checkpoint's renamed), shapes checked against the config."""
    from t5x_like.models.base import unbox

    cfg = config_from_hf(hf_config)
    params = params_from_hf(tensors, cfg)
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
# ------------------------------------------------------------------------------ reference
def load_hf_model(checkpoint_dir: str):
    """transformers' own T5ForConditionalGeneration, read from local files only."""
    hf_files.require_torch()
    from transformers import T5ForConditionalGeneration

    model = T5ForConditionalGeneration.from_pretrained(
        checkpoint_dir, local_files_only=True, use_safetensors=True
    )
    return model.float().eval()


def example_batch(
    vocab_size: int, batch_size: int = 2, input_len: int = 12, target_len: int = 9, seed: int = 0
) -> dict[str, np.ndarray]:
    """Random tokens (ids 2..vocab-1) with trailing padding on the encoder side of row 0."""
    rng = np.random.default_rng(seed)
    inputs = rng.integers(2, vocab_size, (batch_size, input_len)).astype(np.int32)
    inputs[0, input_len - 3 :] = 0
    targets = rng.integers(2, vocab_size, (batch_size, target_len)).astype(np.int32)
    decoder_inputs = np.concatenate([np.zeros((batch_size, 1), np.int32), targets[:, :-1]], axis=1)
    return {
        "encoder_input_tokens": inputs,
        "decoder_input_tokens": decoder_inputs,
        "decoder_target_tokens": targets,
    }


def max_abs_differences(
    hf_model: Any, config: T5Config, params: Any, batch: dict[str, np.ndarray]
) -> dict[str, float]:
    """Largest |ours - reference| of the encoder output (real positions) and decoder logits."""
    import torch

    inputs = batch["encoder_input_tokens"]
    attention_mask = (inputs > 0).astype(np.int64)
    with torch.no_grad():
        out = hf_model(
            input_ids=torch.tensor(inputs, dtype=torch.long),
            attention_mask=torch.tensor(attention_mask),
            decoder_input_ids=torch.tensor(batch["decoder_input_tokens"], dtype=torch.long),
        )
    ref_encoded = out.encoder_last_hidden_state.numpy()
    ref_logits = out.logits.numpy()

    model = EncoderDecoderModel(config)
    encoded = np.asarray(
        model.module.apply({"params": params}, jnp.asarray(inputs), method=Transformer.encode)
    )
    logits = np.asarray(model.logits(params, {k: jnp.asarray(v) for k, v in batch.items()}))
    real = attention_mask.astype(bool)
    return {
        "encoder": float(np.max(np.abs(encoded[real] - ref_encoded[real]))),
        "logit": float(np.max(np.abs(logits - ref_logits))),
    }


def verify(checkpoint_dir: str, cfg: T5Config, params: Params) -> dict[str, float]:
    """Our model and transformers' on the same batch: the largest differences."""
    return max_abs_differences(
        load_hf_model(checkpoint_dir), cfg, params, example_batch(cfg.vocab_size)
    )


def export(
    directory: str, params: Params, cfg: T5Config, architecture: str | None = None
) -> tuple[Callable[[], object], str]:
    del architecture  # one architecture: the text-to-text model
    return lambda: save_hf_checkpoint(directory, params, cfg), "T5ForConditionalGeneration"


def tokenizer(directory: str, model_type: str) -> tuple[dict[str, str], dict[str, Any]] | None:
    """T5Tokenizer's spiece.model with its extra ids (the sentinels; 100 unless its
    tokenizer_config.json says otherwise)."""
    files = hf_files.present(directory, "spiece.model")
    if files is None:
        return None
    extra_ids = int(hf_files.tokenizer_config(directory).get("extra_ids", 100))
    return files, {"type": "sentencepiece", "file": "spiece.model", "extra_ids": extra_ids}


HUGGINGFACE = hf_families.register(
    hf_families.HuggingFaceFamily(("t5",), T5Config, load_hf_checkpoint, verify, export, tokenizer)
)
