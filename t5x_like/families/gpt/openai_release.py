"""OpenAI's GPT-1 release (openai/finetune-transformer-lm, `model/`): `params_shapes.json`,
`params_{0..9}.npy`, `encoder_bpe_40000.json` and `vocab_40000.bpe` -> our checkpoint.

The release is the pretrained language model's arrays with their names left out: the shapes
file lists them in the order train.py creates its variables (the position embedding, the token
embedding, then per block `attn/c_attn/{w,b}`, `attn/c_proj/{w,b}`, `ln_1/{g,b}`,
`mlp/c_fc/{w,b}`, `mlp/c_proj/{w,b}`, `ln_2/{g,b}`), and the ten `.npy` files are their
concatenation cut in ten. The arrays are renamed to transformers' OpenAI GPT tensors (the
`[1, in, out]` convolution weights squeezed, as `load_tf_weights_in_openai_gpt` does) and read
by the HuggingFace path, so both imports share one name map.

The release has no config file. Width, depth, context and vocabulary come from the shapes;
the number of heads (which no shape shows) is the paper's and train.py's 12, and the rest is
train.py's: a 4x feed-forward layer, post-LN with epsilon 1e-5, and its GELU, the tanh
approximation.
"""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np

from t5x_like import storage
from t5x_like.checkpoints import hf_files, original_formats
from t5x_like.errors import CheckpointError
from t5x_like.families.gpt import hf

Tensor = np.ndarray

SHAPES = "params_shapes.json"
ENCODER = "encoder_bpe_40000.json"
MERGES = "vocab_40000.bpe"
SHARDS = 10  # train.py reads params_0.npy .. params_9.npy
HEADS = 12  # GPT-1 paper, section 4.1; train.py's --n_head
# The arrays of one block, in train.py's order of creation.
BLOCK = (
    "attn.c_attn.weight",
    "attn.c_attn.bias",
    "attn.c_proj.weight",
    "attn.c_proj.bias",
    "ln_1.weight",
    "ln_1.bias",
    "mlp.c_fc.weight",
    "mlp.c_fc.bias",
    "mlp.c_proj.weight",
    "mlp.c_proj.bias",
    "ln_2.weight",
    "ln_2.bias",
)


def _read_json(path: str, what: str, expect: type) -> Any:
    if not storage.exists(path):
        raise CheckpointError(f"No {os.path.basename(path)} in {os.path.dirname(path)}; {what}")
    return hf_files.read_json(path, what, expect)


def _shapes(directory: str) -> list[tuple[int, ...]]:
    fetch = "OpenAI's release has it in finetune-transformer-lm's model/: fetch it again."
    shapes = _read_json(os.path.join(directory, SHAPES), fetch, list)
    if not (
        isinstance(shapes, list)
        and all(isinstance(s, list) and all(isinstance(d, int) for d in s) for s in shapes)
    ):
        raise CheckpointError(f"{os.path.join(directory, SHAPES)} is not a list of shapes; {fetch}")
    if len(shapes) < 2 + len(BLOCK) or (len(shapes) - 2) % len(BLOCK):
        raise CheckpointError(
            f"{SHAPES} lists {len(shapes)} arrays; GPT-1's release has 2 embeddings and "
            f"{len(BLOCK)} arrays per block. This is not a GPT-1 checkpoint."
        )
    return [tuple(s) for s in shapes]


def _arrays(directory: str, shapes: list[tuple[int, ...]]) -> list[Tensor]:
    """The arrays: the shards concatenated and cut at the shapes' sizes, as train.py does."""
    paths = [os.path.join(directory, f"params_{n}.npy") for n in range(SHARDS)]
    missing = [os.path.basename(p) for p in paths if not storage.exists(p)]
    if missing:
        raise CheckpointError(
            f"{directory} lacks {', '.join(missing)}: the release's arrays are in {SHARDS} "
            "files, params_0.npy .. params_9.npy. The download is incomplete: fetch them again."
        )
    shards = []
    for path in paths:
        try:
            shards.append(np.load(io.BytesIO(storage.read_bytes(path)), allow_pickle=False))
        except (ValueError, EOFError) as e:  # not an .npy, or a truncated (or empty) one
            raise CheckpointError(
                f"{path} is not a readable .npy file ({e}); it may be truncated: fetch it again."
            ) from None
    flat = np.concatenate([s.reshape(-1) for s in shards])
    sizes = [int(np.prod(s)) for s in shapes]
    if flat.size != sum(sizes):
        raise CheckpointError(
            f"The {SHARDS} params_*.npy files hold {flat.size:,} values but {SHAPES} lists "
            f"{sum(sizes):,}: the files are not from one release. Fetch them again."
        )
    pieces = np.split(flat.astype(np.float32), np.cumsum(sizes)[:-1])
    return [piece.reshape(shape) for piece, shape in zip(pieces, shapes)]


def hf_config(shapes: list[tuple[int, ...]]) -> dict:
    """transformers' OpenAI GPT config.json for the release's shapes."""
    (context, width), (vocab, token_width) = shapes[0], shapes[1]
    if token_width != width or width % HEADS:
        raise CheckpointError(
            f"{SHAPES} gives embeddings of widths {width} and {token_width}; GPT-1's are one "
            f"width, a multiple of its {HEADS} heads."
        )
    return {
        "model_type": "openai-gpt",
        "vocab_size": vocab,
        "n_positions": context,
        "n_embd": width,
        "n_layer": (len(shapes) - 2) // len(BLOCK),
        "n_head": HEADS,
        "afn": "gelu",
    }


def _expected_shapes(config: dict) -> list[tuple[int, ...]]:
    """The shapes train.py gives its variables for `config` (the convolutions' [1, in, out])."""
    d, ctx = config["n_embd"], config["n_positions"]
    block = [(1, d, 3 * d), (3 * d,), (1, d, d), (d,), (d,), (d,)]
    block += [(1, d, 4 * d), (4 * d,), (1, 4 * d, d), (d,), (d,), (d,)]
    return [(ctx, d), (config["vocab_size"], d)] + block * config["n_layer"]


def hf_tensors(arrays: list[Tensor], config: dict) -> dict[str, Tensor]:
    """The arrays under transformers' OpenAI GPT names, every shape checked first."""
    for i, (array, want) in enumerate(zip(arrays, _expected_shapes(config))):
        if array.shape != want:
            name = _names(config)[i]
            raise CheckpointError(
                f"{SHAPES}[{i}] ({name}) has shape {list(array.shape)}; a GPT-1 of width "
                f"{config['n_embd']} has {list(want)} there."
            )
    return {
        name: array.squeeze(0) if array.ndim == 3 else array
        for name, array in zip(_names(config), arrays)
    }


def _names(config: dict) -> list[str]:
    names = ["transformer.positions_embed.weight", "transformer.tokens_embed.weight"]
    for i in range(config["n_layer"]):
        names += [f"transformer.h.{i}.{name}" for name in BLOCK]
    return names


def _tokenizer(directory: str, vocab_size: int) -> dict[str, str]:
    """The BPE files, checked to be the model's: as many tokens as embedding rows."""
    fetch = "GPT-1's tokenizer travels with its weights (finetune-transformer-lm's model/)."
    encoder = _read_json(os.path.join(directory, ENCODER), fetch, dict)
    if not isinstance(encoder, dict) or len(encoder) != vocab_size:
        size = len(encoder) if isinstance(encoder, dict) else "no"
        raise CheckpointError(
            f"{ENCODER} has {size} tokens but the token embedding has {vocab_size} rows: the "
            "vocabulary is not this checkpoint's. Use the files released with it."
        )
    merges = os.path.join(directory, MERGES)
    if not storage.exists(merges):
        raise CheckpointError(f"No {MERGES} (the BPE merges) in {directory}; {fetch}")
    return {ENCODER: os.path.join(directory, ENCODER), MERGES: merges}


def recognises(path: str) -> bool:
    return storage.isdir(path) and storage.exists(os.path.join(path, SHAPES))


def load(path: str) -> original_formats.Imported:
    shapes = _shapes(path)
    config = hf_config(shapes)
    tensors = hf_tensors(_arrays(path, shapes), config)
    files = _tokenizer(path, config["vocab_size"])
    cfg = hf.config_from_hf(config)
    return original_formats.Imported(
        cfg,
        hf.params_from_hf(tensors, cfg),
        tokenizer_files=files,
        vocabulary={"type": "gpt1_bpe", "vocab": ENCODER, "merges": MERGES},
    )


OPENAI_GPT = original_formats.register(
    original_formats.OriginalFormat(
        name="OpenAI GPT-1 release",
        looks_for=f"{SHAPES}, params_0.npy .. params_9.npy, {ENCODER} and {MERGES}",
        recognises=recognises,
        load=load,
    )
)
