"""The tokenizer that travels with a converted checkpoint: its files in `tokenizer/` beside the
orbax steps, and `tokenizer/vocabulary.json` saying how they make the model's vocabulary.

A model's ids mean nothing without the vocabulary it was trained with, so an import keeps the
release's own files (Google BERT's `vocab.txt`, OpenAI GPT-1's BPE files, ...) with the weights
instead of leaving the user to find the matching ones again.
"""

from __future__ import annotations

import json
import os
from typing import Any

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
