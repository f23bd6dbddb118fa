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


def save_params(directory: str, params: Params, config: T5Config, step: int = 0,
                keep: int | None = None) -> str:
    """Write `params` and `config` as step `step` of an orbax checkpoint directory (keeping
    the newest `keep` steps; None keeps all)."""
    with _manager(directory, max_to_keep=keep, create=True) as manager:
        manager.save(step, args=ocp.args.Composite(
            params=ocp.args.StandardSave(params), config=ocp.args.JsonSave(config.to_json())))
        manager.wait_until_finished()
    return os.path.join(os.path.abspath(directory), str(step))


def restore_config(directory: str, step: int | None = None) -> Any:
    """The model config saved beside the parameters: a T5Config, or a BertConfig for a
    checkpoint whose config says `"family": "bert"`."""
    with _manager(directory) as manager:
        step = manager.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"No checkpoint in {directory}.")
        restored = manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))
    data = restored["config"]
    if data.get("family") == "bert":
        from t5x_like.models.bert import BertConfig

        return BertConfig.from_json(data)
    return T5Config(**data)


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


# Fields that decide parameter shapes and meaning; dropout, dtype and the like may differ
# between pretraining and fine-tuning.
ARCHITECTURE_FIELDS = ("vocab_size", "emb_dim", "num_heads", "head_dim", "mlp_dim",
                       "num_encoder_layers", "num_decoder_layers", "mlp_activations",
                       "logits_via_embedding", "relative_attention_num_buckets")


def checkpoint_directory(path: str) -> str:
    """Accept a run's MODEL_DIR (its `checkpoints/`), a checkpoints directory, or a converted
    checkpoint directory."""
    path = os.path.abspath(os.path.expanduser(path))
    nested = os.path.join(path, "checkpoints")
    return nested if os.path.isdir(nested) else path


def check_compatible(saved: T5Config, config: T5Config, where: str) -> None:
    """Refuse a checkpoint of another architecture or vocabulary before loading anything."""
    diffs = [f"{k}: checkpoint {getattr(saved, k)!r} vs config {getattr(config, k)!r}"
             for k in ARCHITECTURE_FIELDS if getattr(saved, k) != getattr(config, k)]
    if diffs:
        from t5x_like.config import ConfigError

        raise ConfigError(f"The checkpoint in {where} does not fit this model ({'; '.join(diffs)}"
                          "). Use the checkpoint's model gin file (or its vocabulary).")


def load_pretrained(path: str, config: T5Config, abstract_params: Params,
                    step: int | None = None) -> Params:
    """Parameters of a pretrained checkpoint for `config`, checked first, restored onto the
    shardings of `abstract_params`."""
    directory = checkpoint_directory(path)
    try:
        saved = restore_config(directory, step)
    except FileNotFoundError as e:
        from t5x_like.config import ConfigError

        raise ConfigError(f"No checkpoint in {directory}: give a run's MODEL_DIR or a "
                          "checkpoint directory (python -m t5x_like.convert writes one).") from e
    check_compatible(saved, config, directory)
    return restore_params(directory, abstract_params, step)
