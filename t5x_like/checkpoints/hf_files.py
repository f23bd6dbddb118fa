"""Reading a HuggingFace checkpoint directory, for every family's conversion: config.json,
the tensors (safetensors, sharded or not, or a `pytorch_model.bin` through torch's weights-only
unpickler, so nothing in a checkpoint can execute code), the tensor transforms between torch's
layouts and ours, and what a check against transformers' own model needs.

Every unreadable, truncated or incomplete file is a `CheckpointError` that names it and says
what to fetch again, before any tensor is read where the file's header allows.
"""

from __future__ import annotations

import json
import os
import pickle
from typing import Any, Callable

import numpy as np

from t5x_like import logs
from t5x_like.errors import CheckpointError

Tensor = np.ndarray

# The largest |ours - transformers'| a conversion's check (`convert --verify`) accepts, float32.
VERIFY_TOLERANCE = 1e-4


def require_torch() -> None:
    """torch and transformers, the reference a conversion is checked against, come with the
    `test` extra, not the runtime dependencies."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise SystemExit(
            "--verify needs torch and transformers, the reference implementation: "
            "pip install -e '.[test]' (or pip install torch==2.13.0 transformers)."
        ) from e


# ------------------------------------------------------------------------------ transforms
# Each parameter's transform is a pair (HF -> ours, ours -> HF), so one table serves import
# and export (every family's name map uses these).
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


# ------------------------------------------------------------------------------ reading
def read_json(path: str, what: str, expect: type = dict) -> Any:
    """A JSON value of type `expect` from `path` (local or in a bucket); unreadable, not JSON
    or of another type is a CheckpointError naming the file (and the line and column of a
    syntax error), followed by `what` to do."""
    from t5x_like import storage

    try:
        value = json.loads(storage.read_bytes(path).decode("utf-8"))
    except UnicodeDecodeError as e:
        raise CheckpointError(
            f"{path} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); {what}"
        ) from None
    except json.JSONDecodeError as e:
        raise CheckpointError(
            f"{path}:{e.lineno}: not valid JSON ({e.msg} at column {e.colno}); {what}"
        ) from None
    except storage.ERRORS as e:
        reason = getattr(e, "strerror", None) or getattr(e, "message", None) or e
        raise CheckpointError(f"{path} cannot be read ({reason}); {what}") from None
    if not isinstance(value, expect):
        kind = "an object" if expect is dict else f"a {expect.__name__}"
        raise CheckpointError(f"{path} holds a JSON {type(value).__name__}, not {kind}; {what}")
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
    weight_map = read_json(index_path, redo).get("weight_map")
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
    return read_json(
        path,
        "it should be the config.json transformers' save_pretrained writes: fetch or re-save it.",
    )


def tokenizer_config(checkpoint_dir: str) -> dict[str, Any]:
    """tokenizer_config.json's settings (`do_lower_case`, `extra_ids`, ...), {} without one."""
    path = os.path.join(checkpoint_dir, "tokenizer_config.json")
    if not os.path.exists(path):
        return {}
    return read_json(path, "re-save the tokenizer with transformers' save_pretrained.")


def present(checkpoint_dir: str, *names: str) -> dict[str, str] | None:
    """{name: path} when every one of `names` is in the directory, else None."""
    paths = {name: os.path.join(checkpoint_dir, name) for name in names}
    return paths if all(os.path.isfile(p) for p in paths.values()) else None
