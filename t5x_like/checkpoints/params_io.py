"""Parameter checkpoints on orbax: the model's parameters plus the config that shaped them.

The config travels with the parameters so a restore can rebuild the model, and so a checkpoint
of another size or vocabulary is refused with a message instead of a shape error deep in XLA.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp

from t5x_like import storage
from t5x_like.models.base import ModelConfig, config_from_json

Params = Any


# Replica-parallel saving splits each replicated array among its replicas so that several
# hosts write parts of it. Each part is cut by a slice that XLA compiles once per array shape
# and replica offset: on 8 data-parallel devices a 30-array tree cost 240 compiles and 18 s on
# its first save, against 0.04 s without. Within one host the same process writes every part
# anyway, so the split only pays when replicas span hosts, and then only for large arrays.
REPLICA_PARALLEL_MIN_SLICE_BYTES = 16 << 20


@functools.cache
def use_array_handler_for_this_job() -> None:
    """Register orbax's jax.Array handler with replica-parallel saving only across hosts and
    for slices of at least REPLICA_PARALLEL_MIN_SLICE_BYTES (once per process; the files a
    checkpoint holds read back the same either way)."""
    ocp.type_handlers.register_type_handler(
        jax.Array,
        ocp.type_handlers.ArrayHandler(
            use_replica_parallel=jax.process_count() > 1,
            min_slice_bytes_for_replica_parallel=REPLICA_PARALLEL_MIN_SLICE_BYTES,
        ),
        override=True,
    )


def orbax_manager(
    directory: str, item_handlers: Any = None, **options: Any
) -> ocp.CheckpointManager:
    """An orbax CheckpointManager on `directory` (a local path or bucket URL) with `options`
    (CheckpointManagerOptions fields), saving through this job's array handler
    (`use_array_handler_for_this_job`)."""
    use_array_handler_for_this_job()
    return ocp.CheckpointManager(
        storage.resolve(directory),
        item_handlers=item_handlers,
        options=ocp.CheckpointManagerOptions(**options),
    )


def save_params(
    directory: str, params: Params, config: ModelConfig, step: int = 0, keep: int | None = None
) -> str:
    """Write `params` and `config` as step `step` of an orbax checkpoint directory (keeping
    the newest `keep` steps; None keeps all)."""
    with orbax_manager(directory, max_to_keep=keep, create=True) as manager:
        manager.save(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardSave(params), config=ocp.args.JsonSave(config.to_json())
            ),
        )
        manager.wait_until_finished()
    return os.path.join(storage.resolve(directory), str(step))


def restore_config(directory: str, step: int | None = None) -> Any:
    """The model config saved beside the parameters (see `config_from_json`)."""
    with orbax_manager(directory) as manager:
        step = manager.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"No checkpoint in {directory}.")
        restored = manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))
    return config_from_json(restored["config"])


def restore_params(directory: str, abstract_params: Params, step: int | None = None) -> Params:
    """Parameters restored onto the shardings/dtypes of `abstract_params` (ShapeDtypeStructs)."""
    with orbax_manager(directory) as manager:
        step = manager.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"No checkpoint in {directory}.")
        restored = manager.restore(
            step, args=ocp.args.Composite(params=ocp.args.StandardRestore(abstract_params))
        )
    return restored["params"]


# How a step is computed, not what the model is: a resumed run may change them.
COMPUTE_ONLY_FIELDS = ("dtype", "remat_policy", "attention_implementation")


def checkpoint_directory(path: str) -> str:
    """Accept a run's MODEL_DIR (its `checkpoints/`), a checkpoints directory, or a converted
    checkpoint directory."""
    path = storage.resolve(path)
    nested = os.path.join(path, "checkpoints")
    return nested if storage.isdir(nested) else path


def check_compatible(saved: ModelConfig, config: ModelConfig, where: str) -> None:
    """Refuse a checkpoint of another architecture or vocabulary before loading anything."""
    from t5x_like.errors import ConfigError

    if type(saved) is not type(config):
        raise ConfigError(
            f"The checkpoint in {where} is a {type(saved).__name__} model, not a "
            f"{type(config).__name__} one; use a model gin file of its family."
        )
    fields = type(config).ARCHITECTURE_FIELDS
    diffs = [
        f"{k}: checkpoint {getattr(saved, k)!r} vs config {getattr(config, k)!r}"
        for k in fields
        if getattr(saved, k) != getattr(config, k)
    ]
    if diffs:
        raise ConfigError(
            f"The checkpoint in {where} does not fit this model ({'; '.join(diffs)}"
            "). Use the checkpoint's model gin file (or its vocabulary)."
        )


def load_pretrained(
    path: str,
    config: Any,
    abstract_params: Params,
    step: int | None = None,
    fresh_params: Callable[[], Params] | None = None,
) -> Params:
    """Parameters of a pretrained checkpoint for `config`, checked first, restored onto the
    shardings of `abstract_params`.

    When the model has parts the checkpoint lacks (a fine-tuning head on a pretrained BERT),
    the top-level modules the two share are taken from the checkpoint and the rest from
    `fresh_params()`; parts of the checkpoint the model does not use (BERT's pretraining
    heads) are dropped. Which is which is printed."""
    directory = checkpoint_directory(path)
    try:
        saved = restore_config(directory, step)
    except FileNotFoundError as e:
        from t5x_like.errors import ConfigError

        raise ConfigError(
            f"No checkpoint in {directory}: give a run's MODEL_DIR or a "
            "checkpoint directory (python -m t5x_like.convert writes one)."
        ) from e
    check_compatible(saved, config, directory)
    saved_scanned = saved.scan_layers
    if saved_scanned == config.scan_layers:
        return _restore_pretrained(directory, step, abstract_params, fresh_params)
    # Another layer layout: restore in the checkpoint's, then restack for this model.
    import jax

    from t5x_like.checkpoints import scan_layout

    as_saved = scan_layout.to_layout(abstract_params, saved_scanned)
    fresh_as_saved = (
        None
        if fresh_params is None
        else lambda: scan_layout.to_layout(fresh_params(), saved_scanned)
    )
    params = _restore_pretrained(directory, step, as_saved, fresh_as_saved)
    params = scan_layout.to_layout(params, not saved_scanned)
    print(
        f"From {directory}: converted the {'scanned' if saved_scanned else 'per-layer'} "
        f"layers to the {'per-layer' if saved_scanned else 'scanned'} layout.",
        flush=True,
    )
    return jax.device_put(params, jax.tree_util.tree_map(lambda a: a.sharding, abstract_params))


def _restore_pretrained(
    directory: str,
    step: int | None,
    abstract_params: Params,
    fresh_params: Callable[[], Params] | None,
) -> Params:
    saved_tree = _saved_structure(directory, step)
    if set(saved_tree) == set(abstract_params) or fresh_params is None:
        return restore_params(directory, abstract_params, step)
    return _graft(directory, step, saved_tree, abstract_params, fresh_params)


def restore_saved_params(directory: str, step: int | None = None) -> Params:
    """All the parameters a checkpoint holds, whatever model wrote them, on one device (for
    export and inspection)."""
    import jax

    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree_util.tree_map(
        lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=device),
        _saved_structure(directory, step),
    )
    return restore_params(directory, abstract, step)


def _saved_structure(directory: str, step: int | None) -> dict:
    """The saved parameter tree's shapes and dtypes (orbax metadata; no array is read)."""
    handlers = {"params": ocp.StandardCheckpointHandler()}
    with orbax_manager(directory, item_handlers=handlers) as manager:
        step = manager.latest_step() if step is None else step
        metadata = manager.item_metadata(step)
    tree = metadata["params"]
    return dict(getattr(tree, "tree", tree))


def _graft(
    directory: str,
    step: int | None,
    saved_tree: dict,
    abstract_params: Params,
    fresh_params: Callable[[], Params],
) -> Params:
    from t5x_like.errors import ConfigError

    shared = [k for k in abstract_params if k in saved_tree]
    if not shared:
        raise ConfigError(
            f"The checkpoint in {directory} shares no module with this model "
            f"(checkpoint: {sorted(saved_tree)}; model: {sorted(abstract_params)})."
        )
    wanted = {k: abstract_params[k] for k in shared}
    as_saved, grown = _saved_shapes(wanted, {k: saved_tree[k] for k in shared}, directory)
    restored = restore_params(directory, as_saved, step)
    fresh = dict(fresh_params())
    if grown:
        restored = _grow_rows(restored, fresh, wanted)
    params = dict(fresh)
    params.update(restored)
    new = sorted(k for k in abstract_params if k not in saved_tree)
    dropped = sorted(k for k in saved_tree if k not in abstract_params)
    print(
        f"From {directory}: {', '.join(shared)}; newly initialised: {', '.join(new) or '-'}; "
        f"unused from the checkpoint: {', '.join(dropped) or '-'}"
        + "".join(f"; {g}" for g in grown),
        flush=True,
    )
    return params


def _saved_shapes(wanted: Params, saved: dict, directory: str) -> tuple[Params, list[str]]:
    """The restore target: the model's shapes, except tables the model extends with extra
    rows (GPT-1's special tokens after a pretrained vocabulary), read at their saved shape
    (replicated) to be grown by `_grow_rows`. Any other shape difference is refused."""
    import jax

    from t5x_like.errors import ConfigError

    grown: list[str] = []

    def target(path, leaf, meta):
        shape, saved_shape = tuple(leaf.shape), tuple(meta.shape)
        if shape == saved_shape:
            return leaf
        name = "/".join(str(getattr(k, "key", k)) for k in path)
        if shape[1:] != saved_shape[1:] or shape[0] < saved_shape[0]:
            raise ConfigError(
                f"{name} is {saved_shape} in the checkpoint in {directory} but "
                f"{shape} in this model."
            )
        grown.append(
            f"{name} extended from {saved_shape[0]} to {shape[0]} rows (new rows "
            "freshly initialised)"
        )
        replicated = jax.sharding.NamedSharding(leaf.sharding.mesh, jax.sharding.PartitionSpec())
        return jax.ShapeDtypeStruct(saved_shape, leaf.dtype, sharding=replicated)

    return jax.tree_util.tree_map_with_path(target, wanted, saved), grown


def _grow_rows(restored: Params, fresh: Params, wanted: Params) -> Params:
    """Saved rows first, then the fresh initialisation's remaining rows, on the model's
    sharding."""
    import jax

    def grow(old, new_init, leaf):
        if old.shape == tuple(leaf.shape):
            return old
        rows = jax.device_get(new_init).copy()
        rows[: old.shape[0]] = jax.device_get(old)
        return jax.device_put(rows, leaf.sharding)

    return jax.tree_util.tree_map(grow, restored, {k: fresh[k] for k in restored}, wanted)
