"""Where each checkpoint's input position lives: the saved state of every data shard's
iterator at checkpoint `step`, in `MODEL_DIR/input_state/<step>`, so a resumed run reads on
from the exact example instead of skipping batches (`train_data.HostBatches` saves and
restores it).
"""

from __future__ import annotations

import os

from t5x_like import storage

INPUT_STATE_DIR = "input_state"


def input_state_dir(model_dir: str, step: int) -> str:
    """Where the input pipeline's position at checkpoint `step` is saved."""
    return os.path.join(model_dir, INPUT_STATE_DIR, str(step))


def remove_input_states_before(model_dir: str, step: int) -> None:
    """Drop the saved positions of steps before `step` (the oldest checkpoint kept)."""
    root = os.path.join(model_dir, INPUT_STATE_DIR)
    for name in storage.listdir(root):
        name = name.rstrip("/")
        if name.isdigit() and int(name) < step:
            storage.remove_tree(os.path.join(root, name))
