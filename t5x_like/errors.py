"""Every error this codebase raises for a user to act on, in one module that imports nothing.

Each is a ConfigError (a ValueError) or a RuntimeError whose message says what to change; the
entry points print the message as one line instead of a traceback (`t5x_like.cli`). Being a leaf,
any module can raise them without importing the configuration machinery.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration or input that cannot work; the message says what to change."""


class ModelDirInUse(ConfigError):
    """Another live run holds MODEL_DIR."""


class CheckpointUnreadable(ConfigError):
    """A checkpoint on disk that cannot be restored (truncated, missing or damaged files)."""


class CheckpointWriteFailed(ConfigError):
    """A save that could not be written (disk full, no permission): the earlier checkpoints
    are intact and the message says how to resume."""


class CheckpointError(ValueError):
    """A HuggingFace checkpoint that does not fit the model; the message names the tensor."""


class NonFiniteLoss(RuntimeError):
    """Training stopped (Health.nonfinite_policy='stop') at a step whose loss or gradient norm
    was NaN/Inf; the message names the step, the metric and what was saved."""
