"""Native t5x checkpoints (t5x's `checkpoints.py` layout, as in its released T5.1.0, T5.1.1,
LM-adapted and Flan-T5 checkpoints) -> our checkpoint.

A t5x step directory `checkpoint_N/` holds `checkpoint`, the msgpack (flax.serialization) of
`{"version": 3, "optimizer": {"target": params, "state": optimizer state}}`. Each parameter is
either an array inline in that file or a TensorStore spec (zarr, its path relative to the step
directory, e.g. `target.encoder.layers_0.attention.query.kernel/`), which TensorStore reads from
disk or straight from a bucket (`gs://`, its gcs driver). Only `target` is read: the optimizer
state is left alone.

t5x's parameter tree is the one this codebase's T5 keeps (the same module names, from t5x's
`network.py`), except that t5x stores every `DenseGeneral` kernel flattened to two dimensions:
attention projections are (embed, heads * head_dim) and (heads * head_dim, embed) there and
three-dimensional here. The model's sizes come from the shapes (the relative-position
embedding gives the heads and buckets), the output layer from whether `logits_dense` exists
(T5.1.1: untied; T5.1.0: tied and scaled), and the feed-forward activation from the layer: one
`wi` is T5.1.0's ReLU, `wi_0`/`wi_1` T5.1.1's gated GELU. t5x keeps its vocabulary apart (its
gin files name `gs://t5-data/vocabs/cc_all.32000.100extra/sentencepiece.model`); a
`sentencepiece.model` placed in the step directory is kept as the checkpoint's tokenizer.
"""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np

from t5x_like import logs, storage
from t5x_like.checkpoints import original_formats
from t5x_like.errors import CheckpointError
from t5x_like.families.t5 import hf
from t5x_like.families.t5.network import T5Config

Tensor = np.ndarray
MSGPACK = "checkpoint"
SENTENCEPIECE = "sentencepiece.model"
_STEP_DIRECTORY = re.compile(r"checkpoint_(\d+)")
# msgpack's map markers (fixmap, map16, map32): a TF1 `checkpoint` file is text instead.
_MSGPACK_MAP = {*range(0x80, 0x90), 0xDE, 0xDF}


def _is_msgpack_checkpoint(directory: str) -> bool:
    path = os.path.join(directory, MSGPACK)
    if not storage.exists(path) or storage.isdir(path):
        return False
    with storage.tensorflow().io.gfile.GFile(path, "rb") as f:
        head = f.read(1)
    return bool(head) and head[0] in _MSGPACK_MAP


def step_directory(path: str) -> str:
    """`path` itself when it is a step directory, else its newest `checkpoint_N/`."""
    if _is_msgpack_checkpoint(path):
        return path
    steps = sorted(
        (int(m.group(1)), name)
        for name in storage.listdir(path)
        if (m := _STEP_DIRECTORY.fullmatch(name.rstrip("/")))
    )
    for _, name in reversed(steps):
        candidate = os.path.join(path, name.rstrip("/"))
        if _is_msgpack_checkpoint(candidate):
            return candidate
    raise CheckpointError(
        f"No t5x checkpoint in {path}: a t5x step directory checkpoint_N/ holds the msgpack "
        f"file `{MSGPACK}` beside its TensorStore arrays. (A checkpoint_N/ with `state/` is "
        "t5x's newer orbax format, which this importer does not read.)"
    )


def recognises(path: str) -> bool:
    try:
        step_directory(path)
    except CheckpointError:
        return False
    return True


def _is_spec(value: Any) -> bool:
    return isinstance(value, dict) and "driver" in value and "kvstore" in value


def _absolute_spec(spec: dict, directory: str) -> dict:
    """The spec with its relative path made absolute, as t5x's
    `_update_ts_path_from_relative_to_absolute` does (bucket and path for `gs://`), and the
    write-time chunking left to the stored array's own metadata."""
    spec = {**spec, "kvstore": dict(spec["kvstore"]), "metadata": dict(spec.get("metadata", {}))}
    spec["metadata"].pop("chunks", None)
    spec["metadata"].pop("compressor", None)
    bucket = re.fullmatch(r"gs://([^/]*)/(.*)", directory, re.DOTALL)
    if bucket:
        spec["kvstore"].update(driver="gcs", bucket=bucket.group(1))
        directory = bucket.group(2)
    elif spec["kvstore"].get("driver") in ("gcs", "gfile"):
        # Written in a bucket, read from a local copy: t5x's _maybe_update_ts_from_gcs_to_file.
        path = spec["kvstore"].get("path", spec.pop("path", None))
        spec["kvstore"] = {"driver": "file", **({"path": path} if path is not None else {})}
    if "path" in spec["kvstore"]:
        spec["kvstore"]["path"] = os.path.join(directory, spec["kvstore"]["path"])
    elif "path" in spec:  # TensorStore < 0.1.14 wrote the path beside the kvstore
        spec["path"] = os.path.join(directory, spec["path"])
    else:
        raise CheckpointError(f"A TensorStore spec in {directory}/{MSGPACK} has no path: {spec}")
    return spec


def _read_array(spec: dict, directory: str, name: str) -> Tensor:
    import tensorstore as ts

    absolute = _absolute_spec(spec, directory)
    if absolute.get("dtype") == "uint16" or absolute["metadata"].get("dtype") == "<u2":
        raise CheckpointError(
            f"{directory}: parameter {name} is stored as uint16, the bfloat16 bit patterns of "
            "t5x's checkpoint version 2; t5x itself refuses to read those (re-save it with a "
            "current t5x, which writes bfloat16)."
        )
    try:
        store = ts.open(absolute, open=True).result()
        return np.asarray(store.read().result())
    except Exception as e:  # noqa: BLE001 - ValueError / ts errors: missing or damaged chunks
        raise CheckpointError(
            f"{directory}: parameter {name} cannot be read from TensorStore "
            f"({str(e).splitlines()[0][:200]}); the checkpoint may be incomplete: fetch it again."
        ) from None


def read_target(directory: str) -> dict[str, Tensor]:
    """{'encoder/layers_0/attention/query/kernel': array, ...}: the `target` parameters."""
    from flax import serialization

    path = os.path.join(directory, MSGPACK)
    try:
        contents = serialization.msgpack_restore(storage.read_bytes(path))
    except Exception as e:  # noqa: BLE001 - msgpack's ExtraData, ValueError: a cut-off file
        raise CheckpointError(
            f"{path} is not a readable t5x checkpoint ({str(e).splitlines()[0][:200]}); it may "
            "be truncated: fetch it again."
        ) from None
    if not isinstance(contents, dict) or not isinstance(contents.get("optimizer"), dict):
        raise CheckpointError(
            f"{path} holds no `optimizer` state: t5x writes {{'version', 'optimizer'}} there "
            "(checkpoint versions 2 and later). This is not a t5x checkpoint this reads."
        )
    target = contents["optimizer"].get("target")
    if not isinstance(target, dict):
        raise CheckpointError(f"{path} has no `target` parameters under `optimizer`.")
    flat: dict[str, Any] = {}

    def walk(node: Any, prefix: tuple[str, ...]) -> None:
        if isinstance(node, dict) and not _is_spec(node):
            for key, child in node.items():
                walk(child, (*prefix, str(key)))
        else:
            flat["/".join(prefix)] = node

    walk(target, ())
    arrays = {}
    with logs.progress(desc="convert read", total=len(flat), unit=" arrays") as bar:
        for name, value in flat.items():
            arrays[name] = (
                _read_array(value, directory, name) if _is_spec(value) else np.asarray(value)
            )
            kind = arrays[name].dtype
            if not (np.issubdtype(kind, np.floating) or kind.name == "bfloat16"):
                raise CheckpointError(
                    f"{path}: parameter target/{name} is {kind.name}, not a float; it is not "
                    "a T5 weight (a bfloat16 one saved as integers cannot be read as numbers)."
                )
            bar.update(1)
    return arrays


def _shape(arrays: dict[str, Tensor], name: str) -> tuple[int, ...]:
    if name not in arrays:
        raise CheckpointError(
            f"The checkpoint has no target/{name}; a t5x T5 checkpoint has it. Is it an "
            "encoder-decoder T5 (not a scanned or decoder-only model), and complete?"
        )
    return tuple(arrays[name].shape)


def config_of(arrays: dict[str, Tensor]) -> T5Config:
    """Our T5Config for the checkpoint, from its parameters' names and shapes."""
    vocab, embed = _shape(arrays, "token_embedder/embedding")
    heads, buckets = _shape(arrays, "encoder/relpos_bias/rel_embedding")
    joined = _shape(arrays, "encoder/layers_0/attention/query/kernel")[1]
    gated = "encoder/layers_0/mlp/wi_0/kernel" in arrays
    mlp = _shape(arrays, f"encoder/layers_0/mlp/{'wi_0' if gated else 'wi'}/kernel")[1]
    if joined % heads:
        raise CheckpointError(
            f"The attention is {joined} wide with {heads} heads (from the relative-position "
            "embedding); T5's width is a multiple of its heads."
        )

    def layers(stack: str) -> int:
        found = {m.group(1) for n in arrays if (m := re.match(rf"{stack}/layers_(\d+)/", n))}
        return len(found)

    return hf.config_from_hf(
        {
            "vocab_size": vocab,
            "d_model": embed,
            "d_kv": joined // heads,
            "d_ff": mlp,
            "num_heads": heads,
            "num_layers": layers("encoder"),
            "num_decoder_layers": layers("decoder"),
            "relative_attention_num_buckets": buckets,
            "feed_forward_proj": "gated-gelu" if gated else "relu",
            "scale_decoder_outputs": "decoder/logits_dense/kernel" not in arrays,
        }
    )


def params_of(arrays: dict[str, Tensor], cfg: T5Config) -> dict[str, Any]:
    """Our parameter tree: t5x's names, the attention kernels unflattened to our 3-D layout;
    an unknown, missing or mis-shaped parameter is refused by its t5x name."""
    import jax

    from t5x_like.families.t5.model import EncoderDecoderModel
    from t5x_like.models.base import unbox

    expected = {
        "/".join(k.key for k in path): leaf
        for path, leaf in jax.tree_util.tree_leaves_with_path(
            unbox(EncoderDecoderModel(cfg).abstract_params())
        )
    }
    unknown = sorted(set(arrays) - set(expected))
    if unknown:
        raise CheckpointError(
            f"The checkpoint holds {len(unknown)} parameter(s) this T5 does not have: "
            f"{original_formats.listed(unknown, 'target/')}."
        )
    missing = sorted(set(expected) - set(arrays))
    if missing:
        raise CheckpointError(
            f"The checkpoint lacks {len(missing)} parameter(s) that its shapes imply: "
            f"{original_formats.listed(missing, 'target/')}."
        )
    params: dict[str, Any] = {}
    for name, want in expected.items():
        value = np.asarray(arrays[name], np.float32)
        if value.shape not in (tuple(want.shape), stored_shape(name, tuple(want.shape))):
            raise CheckpointError(
                f"target/{name} has shape {list(value.shape)}; the model its other parameters "
                f"describe has {list(stored_shape(name, tuple(want.shape)))} there."
            )
        node = params
        *parents, leaf = name.split("/")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value.reshape(want.shape)
    return params


def stored_shape(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape t5x stores a parameter of ours in: its DenseGeneral kernels flattened to 2-D,
    (embed, heads * head_dim) for query/key/value and (heads * head_dim, embed) for out."""
    if re.search(r"/(query|key|value)/kernel$", name):
        return (shape[0], shape[1] * shape[2])
    if name.endswith("/out/kernel"):
        return (shape[0] * shape[1], shape[2])
    return shape


def load(path: str) -> original_formats.Imported:
    directory = step_directory(path)
    logs.log(f"Reading the t5x checkpoint {directory}")
    arrays = read_target(directory)
    cfg = config_of(arrays)
    params = params_of(arrays, cfg)
    return original_formats.with_sentencepiece(
        cfg,
        params,
        directory,
        (SENTENCEPIECE,),
        "gs://t5-data/vocabs/cc_all.32000.100extra/sentencepiece.model",
    )


T5X = original_formats.register(
    original_formats.OriginalFormat(
        name="t5x",
        looks_for="a checkpoint_N/ directory with t5x's msgpack `checkpoint` and TensorStore "
        "arrays, or a directory of them",
        recognises=recognises,
        load=load,
    )
)
