"""The checkpoint formats the papers' authors released, beside HuggingFace's.

A researcher arrives with Google's TF1 BERT (`bert_model.ckpt` + `bert_config.json` +
`vocab.txt`), OpenAI's GPT-1 release (`params_shapes.json` + `params_{0..9}.npy` + its BPE
files) or a Mesh-TensorFlow T5 checkpoint. A family module registers one `OriginalFormat` per
release: how to recognise its directory, and how to read it into our (config, params) with the
tokenizer files that belong to it. `convert --from_original DIR` finds the format here, so a
new format is a module of its own, not an edit of `convert`.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Any, Callable, Sequence

from t5x_like.errors import CheckpointError

Params = Any

# The modules that register the built-in formats.
BUILT_IN = (
    "t5x_like.families.bert.google_tf1",
    "t5x_like.families.gpt.openai_release",
    "t5x_like.families.t5.mesh_tf",
    "t5x_like.families.t5.t5x_native",
)


@dataclasses.dataclass(frozen=True)
class Imported:
    """A checkpoint read from an original format: our config and parameters, the tokenizer
    files that travel with them ({name to keep beside the checkpoint: source path}) and how
    they make the model's vocabulary (`vocabulary`: its type, file and options; None when the
    release keeps its tokenizer elsewhere)."""

    config: Any
    params: Params
    tokenizer_files: dict[str, str]
    vocabulary: dict[str, Any] | None


@dataclasses.dataclass(frozen=True)
class OriginalFormat:
    """`recognises(path)` says whether `path` is a checkpoint of this format (cheap: file
    names only); `load(path)` reads it, refusing with a CheckpointError what it cannot map."""

    name: str
    looks_for: str  # the files that identify it, for the message when nothing matches
    recognises: Callable[[str], bool]
    load: Callable[[str], Imported]


def listed(names: Sequence[str], prefix: str = "", most: int = 5) -> str:
    """The first `most` names for a message ('a, b, c ...'), each with `prefix`."""
    shown = ", ".join(prefix + n for n in names[:most])
    return shown + (" ..." if len(names) > most else "")


def with_sentencepiece(
    config: Any, params: Params, directory: str, names: Sequence[str], released_at: str
) -> Imported:
    """A T5 import, with the first of `names` found in `directory` kept as its SentencePiece
    tokenizer (with T5's 100 sentinel ids after it, unless the model has them as pieces). The
    T5 releases keep their vocabulary apart (`released_at`), so without one nothing is kept and
    the log says where it is."""
    from t5x_like import logs, storage

    found = next((n for n in names if storage.exists(os.path.join(directory, n))), None)
    if found is None:
        logs.log(
            f"No {' or '.join(names)} in {directory}: no tokenizer is kept with the "
            f"checkpoint. Its vocabulary was released as {released_at}."
        )
        return Imported(config, params, tokenizer_files={}, vocabulary=None)
    import sentencepiece

    path = os.path.join(directory, found)
    model = sentencepiece.SentencePieceProcessor(model_proto=storage.read_bytes(path))
    # t5x's cc_all.32000.100extra model holds the sentinels itself; the original one does not.
    has_sentinels = model.piece_to_id("<extra_id_0>") != model.unk_id()
    return Imported(
        config,
        params,
        tokenizer_files={found: path},
        vocabulary={
            "type": "sentencepiece",
            "file": found,
            "extra_ids": 0 if has_sentinels else 100,
        },
    )


_REGISTERED: list[OriginalFormat] = []


def register(original: OriginalFormat) -> OriginalFormat:
    _REGISTERED.append(original)
    return original


def registered() -> list[OriginalFormat]:
    for module in BUILT_IN:
        importlib.import_module(module)
    return list(_REGISTERED)


def for_path(path: str) -> OriginalFormat:
    """The format of the checkpoint at `path`; none or several is a CheckpointError that lists
    what each format looks for."""
    formats = registered()
    matches = [f for f in formats if f.recognises(path)]
    if len(matches) == 1:
        return matches[0]
    known = "; ".join(f"{f.name} ({f.looks_for})" for f in formats)
    if not matches:
        raise CheckpointError(
            f"{path} is not a checkpoint in a format this codebase imports. It reads: {known}. "
            "A HuggingFace directory (config.json + model.safetensors) imports with --from_hf."
        )
    raise CheckpointError(
        f"{path} looks like {' and '.join(f.name for f in matches)} at once; keep one "
        f"checkpoint per directory. The formats: {known}."
    )
