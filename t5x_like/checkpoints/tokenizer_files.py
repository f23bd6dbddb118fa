"""The tokenizer that travels with a converted checkpoint: its files in `tokenizer/` beside the
orbax steps, and `tokenizer/vocabulary.json` saying how they make the model's vocabulary:

    {"type": "wordpiece", "file": "vocab.txt", "lower_case": true}
    {"type": "sentencepiece", "file": "spiece.model", "extra_ids": 100}
    {"type": "gpt2_bpe" | "gpt1_bpe", "vocab": "vocab.json", "merges": "merges.txt"}

A model's ids mean nothing without the vocabulary it was trained with, so an import keeps the
release's own files (Google BERT's `vocab.txt`, OpenAI GPT-1's BPE files, ...) with the weights
instead of leaving the user to find the matching ones again.
"""

from __future__ import annotations

import json
import os
from typing import Any

import seqio

from t5x_like import storage

DIRECTORY = "tokenizer"
DESCRIPTION = "vocabulary.json"


def save(checkpoint_dir: str, files: dict[str, str], vocabulary: dict[str, Any]) -> str:
    """Copy `files` ({name: source path}) into CHECKPOINT_DIR/tokenizer/ with the vocabulary's
    description; returns that directory."""
    directory = os.path.join(checkpoint_dir, DIRECTORY)
    for name, source in files.items():
        storage.copy_file(source, os.path.join(directory, name))
    storage.write_text(
        os.path.join(directory, DESCRIPTION), json.dumps(vocabulary, indent=2, sort_keys=True)
    )
    return directory


def description(checkpoint_dir: str) -> dict[str, Any] | None:
    """The saved vocabulary's description (with `directory` added), or None for a checkpoint
    saved without its tokenizer."""
    directory = os.path.join(checkpoint_dir, DIRECTORY)
    path = os.path.join(directory, DESCRIPTION)
    if not storage.exists(path):
        return None
    return {**json.loads(storage.read_text(path)), "directory": directory}


def vocabulary(checkpoint_dir: str) -> seqio.Vocabulary | None:
    """The seqio vocabulary of the tokenizer saved with a checkpoint, or None without one."""
    described = description(checkpoint_dir)
    if described is None:
        return None
    directory, kind = described["directory"], described["type"]
    if kind == "wordpiece":
        from t5x_like.data.wordpiece import WordPieceVocabulary

        return WordPieceVocabulary(
            os.path.join(directory, described["file"]), lower_case=described["lower_case"]
        )
    if kind == "sentencepiece":
        return seqio.SentencePieceVocabulary(
            os.path.join(directory, described["file"]), extra_ids=described.get("extra_ids", 0)
        )
    if kind in ("gpt2_bpe", "gpt1_bpe"):
        from t5x_like.data.bpe import BPEVocabulary

        return BPEVocabulary(
            os.path.join(directory, described["vocab"]),
            os.path.join(directory, described["merges"]),
            kind.removesuffix("_bpe"),
        )
    raise ValueError(
        f"{os.path.join(directory, DESCRIPTION)} describes a {kind!r} vocabulary; this version "
        "reads wordpiece, sentencepiece, gpt2_bpe and gpt1_bpe."
    )


# What transformers' AutoTokenizer reads for each kind: {kind: ({our key: HF file name},
# tokenizer_config.json without the per-checkpoint settings)}.
_HF_LAYOUT: dict[str, tuple[dict[str, str], dict[str, Any]]] = {
    "wordpiece": ({"file": "vocab.txt"}, {"tokenizer_class": "BertTokenizer"}),
    "sentencepiece": ({"file": "spiece.model"}, {"tokenizer_class": "T5Tokenizer"}),
    "gpt2_bpe": (
        {"vocab": "vocab.json", "merges": "merges.txt"},
        {
            "tokenizer_class": "GPT2Tokenizer",
            "bos_token": "<|endoftext|>",
            "eos_token": "<|endoftext|>",
            "unk_token": "<|endoftext|>",
        },
    ),
    "gpt1_bpe": (
        {"vocab": "vocab.json", "merges": "merges.txt"},
        {"tokenizer_class": "OpenAIGPTTokenizer", "unk_token": "<unk>"},
    ),
}


# The kept tokenizer that tasks without a vocabulary of their own read (`offer_to_tasks`).
_OFFERED: dict[str, Any] | None = None


def offer_to_tasks(path: str | None) -> dict[str, Any] | None:
    """Make the tokenizer kept with the checkpoint at `path` (None: none) the one that tasks
    whose vocabulary is not set read, e.g. BERT's tasks (`tasks/bert.py`) fine-tuning an
    imported BERT read its vocab.txt and casing unless `bert_vocab_path` is bound. Called by
    train (INIT_CHECKPOINT), eval and infer (CHECKPOINT) before any dataset is built, so a
    fine-tune of a converted checkpoint needs no vocabulary binding. Returns the offered
    tokenizer's description."""
    global _OFFERED
    directory = find(path) if path else None
    _OFFERED = description(directory) if directory else None
    return _OFFERED


def offered(kind: str) -> dict[str, Any] | None:
    """The offered tokenizer's description (with its `directory`) if it is of `kind`
    ('wordpiece', 'sentencepiece', 'gpt2_bpe', 'gpt1_bpe'), else None."""
    return _OFFERED if _OFFERED is not None and _OFFERED["type"] == kind else None


BPE_TYPES = ("gpt2_bpe", "gpt1_bpe")


def model_conventions(path: str) -> dict[str, Any] | None:
    """A decoder-only model imported with GPT-2's or GPT-1's BPE keeps that release's
    conventions, not this codebase's (start token 0, EOS 1, prefix-LM prompts): no start
    token, its tokenizer's EOS (GPT-2's `<|endoftext|>`; GPT-1 has none) and causal attention
    over the prompt, as both were trained. Only for the converted directory itself (`path`);
    None for any other checkpoint, a run fine-tuned from it included (its gin model is the one
    it was trained as)."""
    directory = find(path)
    if directory != path or (description(directory) or {}).get("type") not in BPE_TYPES:
        return None  # also a run fine-tuned from one: it decodes as it was trained (gin)
    kept = vocabulary(directory)
    eos_id = kept.eos_id if kept is not None else None
    return {"start_token_id": None, "eos_id": eos_id, "attention": "causal"}


def find(path: str) -> str | None:
    """The directory holding the tokenizer saved for a checkpoint at `path` (a converted
    directory, a run's MODEL_DIR whose checkpoints/ holds it, or that run's best/<task>),
    or None."""
    candidates = [path, os.path.join(path, "checkpoints")]
    parent = os.path.dirname(path.rstrip("/"))
    if os.path.basename(parent) == "best":  # MODEL_DIR/best/<task>: the run's own
        candidates.append(os.path.join(os.path.dirname(parent), "checkpoints"))
    for directory in candidates:
        if storage.exists(os.path.join(directory, DIRECTORY, DESCRIPTION)):
            return directory
    return None


def carry_into_run(init_checkpoint: str | None, model_dir: str) -> str | None:
    """A run fine-tuning a converted checkpoint keeps its tokenizer too (in
    MODEL_DIR/checkpoints/tokenizer/), so eval and infer on the run's checkpoints (or its
    best/<task>) read the same vocabulary with no binding. Returns the copy's directory."""
    source = find(init_checkpoint) if init_checkpoint else None
    if source is None:
        return None
    target = os.path.join(storage.resolve(model_dir), "checkpoints", DIRECTORY)
    if not storage.exists(os.path.join(target, DESCRIPTION)):
        storage.copy_tree(os.path.join(source, DIRECTORY), target)
    return target


def export_hf(checkpoint_dir: str, hf_dir: str) -> list[str]:
    """Write the checkpoint's tokenizer into a HuggingFace directory under transformers' names,
    with a tokenizer_config.json, so `AutoTokenizer.from_pretrained(hf_dir)` reads it; returns
    the files written ([] for a checkpoint saved without its tokenizer)."""
    described = description(checkpoint_dir)
    if described is None:
        return []
    names, config = _HF_LAYOUT[described["type"]]
    written = []
    for key, hf_name in names.items():
        source = os.path.join(described["directory"], described[key])
        storage.copy_file(source, os.path.join(hf_dir, hf_name))
        written.append(hf_name)
    settings = {"do_lower_case": described["lower_case"]} if "lower_case" in described else {}
    if "extra_ids" in described:
        settings["extra_ids"] = described["extra_ids"]
    storage.write_text(
        os.path.join(hf_dir, "tokenizer_config.json"), json.dumps({**config, **settings}, indent=2)
    )
    return [*written, "tokenizer_config.json"]
