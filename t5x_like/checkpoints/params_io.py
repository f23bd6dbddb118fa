"""Parameter checkpoints on orbax: the model's parameters plus the config that shaped them.

The config travels with the parameters so a restore can rebuild the model, and so a checkpoint
of another size or vocabulary is refused with a message instead of a shape error deep in XLA.
"""

from __future__ import annotations

import os
from typing import Any

import orbax.checkpoint as ocp

from t5x_like.models.t5 import T5Config

Params = Any


def _manager(directory: str, **options: Any) -> ocp.CheckpointManager:
    return ocp.CheckpointManager(os.path.abspath(directory),
                                 options=ocp.CheckpointManagerOptions(**options))


def save_params(directory: str, params: Params, config: T5Config, step: int = 0) -> str:
    """Write `params` and `config` as step `step` of an orbax checkpoint directory."""
    with _manager(directory) as manager:
        manager.save(step, args=ocp.args.Composite(
            params=ocp.args.StandardSave(params), config=ocp.args.JsonSave(config.to_json())))
        manager.wait_until_finished()
    return os.path.join(os.path.abspath(directory), str(step))


def restore_config(directory: str, step: int | None = None) -> T5Config:
    with _manager(directory) as manager:
        step = manager.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"No checkpoint in {directory}.")
        restored = manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))
    return T5Config(**restored["config"])


def restore_params(directory: str, abstract_params: Params,
                   step: int | None = None) -> Params:
    """Parameters restored onto the shardings/dtypes of `abstract_params` (ShapeDtypeStructs)."""
    with _manager(directory) as manager:
        step = manager.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"No checkpoint in {directory}.")
        restored = manager.restore(step, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(abstract_params)))
    return restored["params"]
