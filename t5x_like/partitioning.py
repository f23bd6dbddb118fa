"""Device mesh, logical-axis rules and the shardings of everything a step touches.

The model names every parameter axis (`embed`, `mlp`, `heads`, `kv`, `vocab`,
`relpos_buckets`) and the key activations (`batch`, `length`, `embed`, `vocab`); the rules here
map those names onto the mesh axes `('data', 'model')`. A layout is a list of rules, so data
parallelism, tensor (model) parallelism and FSDP are configuration, not code paths:

  data_parallel   batch -> data; everything else replicated
  model_parallel  batch -> data; heads, mlp, vocab -> model (Mesh-TensorFlow's T5 layout)
  fsdp            model_parallel + parameters' `embed` axis -> data, so parameters and
                  optimizer state are split over every device

Rules are tried in order, and a mesh axis is used at most once per array (flax's semantics), so
an activation (batch, length, embed) under FSDP keeps `data` for its batch.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import flax.linen as nn
import gin
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from t5x_like.config import ConfigError

Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

# Logical names that never shard (small tables, per-head sizes, sequence positions).
_ALWAYS_REPLICATED: Rules = (("kv", None), ("relpos_buckets", None), ("length", None))

LAYOUTS: dict[str, Rules] = {
    "data_parallel": (("batch", "data"), ("vocab", None), ("embed", None), ("mlp", None),
                      ("heads", None)) + _ALWAYS_REPLICATED,
    "model_parallel": (("batch", "data"), ("vocab", "model"), ("mlp", "model"),
                       ("heads", "model"), ("embed", None)) + _ALWAYS_REPLICATED,
    "fsdp": (("batch", "data"), ("vocab", "model"), ("mlp", "model"), ("heads", "model"),
             ("embed", "data")) + _ALWAYS_REPLICATED,
}


@gin.configurable
def logical_axis_rules(layout: str = "auto", num_partitions: int = 1,
                       overrides: Sequence[tuple[str, Any]] = ()) -> Rules:
    """The rules of a named layout; `overrides` come first, so they win.

    layout 'auto' is model_parallel when the model axis has more than one device, else
    data_parallel.
    """
    if layout == "auto":
        layout = "model_parallel" if num_partitions > 1 else "data_parallel"
    if layout not in LAYOUTS:
        raise ConfigError(f"Unknown layout {layout!r}; choose one of {sorted(LAYOUTS)} or "
                          "'auto'.")
    return tuple(tuple(r) for r in overrides) + LAYOUTS[layout]


@gin.configurable
def make_mesh(num_partitions: int = 1, mesh_shape: Sequence[int] | None = None,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ('data', 'model') mesh over all devices.

    Either `num_partitions` (devices per model replica; data = devices / num_partitions) or an
    explicit `mesh_shape` (data, model). Devices are laid out with jax's mesh utilities, so on a
    TPU slice neighbouring devices share a model replica.
    """
    devices = list(devices if devices is not None else jax.devices())
    n = len(devices)
    if mesh_shape is not None:
        shape = tuple(int(d) for d in mesh_shape)
        if len(shape) != 2 or math.prod(shape) != n:
            raise ConfigError(f"mesh_shape={shape} does not match the {n} devices: give "
                              f"(data, model) with data * model == {n}.")
    else:
        if num_partitions < 1 or n % num_partitions:
            raise ConfigError(f"num_partitions={num_partitions} does not divide the {n} "
                              f"devices; choose a divisor of {n}.")
        shape = (n // num_partitions, num_partitions)
    try:
        grid = mesh_utils.create_device_mesh(shape, devices)
    except (AssertionError, ValueError, NotImplementedError):
        grid = np.array(devices).reshape(shape)
    return Mesh(grid, ("data", "model"))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) dimension split over 'data'."""
    return NamedSharding(mesh, P("data"))


def check_batch_size(batch_size: int, mesh: Mesh, num_microbatches: int = 1) -> None:
    data = mesh.shape["data"]
    if batch_size % (data * num_microbatches):
        raise ConfigError(
            f"batch_size={batch_size} must be divisible by data-parallel size ({data}) x "
            f"num_microbatches ({num_microbatches}) = {data * num_microbatches}.")


# ---------------------------------------------------------------------------- parameters
def _check_rules_cover(boxed_params: Any, rules: Rules) -> None:
    named = {name for name, _ in rules}
    for path, box in jax.tree_util.tree_leaves_with_path(
            boxed_params, is_leaf=lambda x: isinstance(x, nn.Partitioned)):
        if not isinstance(box, nn.Partitioned):
            continue
        missing = [a for a in box.names if a is not None and a not in named]
        if missing:
            raise ConfigError(
                f"Logical axis {missing[0]!r} of parameter {jax.tree_util.keystr(path)} has no "
                f"partitioning rule; add ('{missing[0]}', None) or a mesh axis to "
                "logical_axis_rules.overrides.")


def param_shardings(boxed_params: Any, mesh: Mesh, rules: Rules) -> Any:
    """NamedShardings (unboxed tree) for parameters that carry logical axis names."""
    _check_rules_cover(boxed_params, rules)
    specs = nn.get_partition_spec(boxed_params)
    shardings = nn.logical_to_mesh_sharding(specs, mesh, list(rules))
    _check_divisible(boxed_params, shardings)
    return shardings


def _check_divisible(boxed_params: Any, shardings: Any) -> None:
    leaves = jax.tree_util.tree_leaves_with_path(
        boxed_params, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    for (path, box), sharding in zip(leaves, jax.tree_util.tree_leaves(shardings)):
        shape = box.value.shape if isinstance(box, nn.Partitioned) else box.shape
        for dim, axes in zip(shape, tuple(sharding.spec)):
            if axes is None:
                continue
            ways = math.prod(sharding.mesh.shape[a] for a in
                             ((axes,) if isinstance(axes, str) else axes))
            if dim % ways:
                raise ConfigError(
                    f"Parameter {jax.tree_util.keystr(path)} of shape {tuple(shape)} cannot be "
                    f"split {ways} ways over mesh axis {axes!r} (size {dim}); pick a mesh whose "
                    f"{axes!r} axis divides {dim}, or a layout that leaves it replicated.")


def _path_key(path) -> tuple[str, ...]:
    return tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def derived_shardings(tree: Any, params: Any, shardings: Any, mesh: Mesh) -> Any:
    """Shardings for a tree that mirrors the parameters (optimizer state).

    Each leaf is matched to the parameter whose path ends its own path. Same shape: the
    parameter's sharding. One dimension fewer (Adafactor's factored row/column moments): the
    parameter's spec with that dimension removed. Anything else (counters, placeholders):
    replicated.
    """
    by_path = {}
    for (path, p), s in zip(jax.tree_util.tree_leaves_with_path(params),
                            jax.tree_util.tree_leaves(shardings)):
        by_path[_path_key(path)] = (tuple(p.shape), s.spec)

    def pick(path, leaf):
        key = _path_key(path)
        for start in range(len(key)):
            if key[start:] in by_path:
                shape, spec = by_path[key[start:]]
                return NamedSharding(mesh, _spec_for(tuple(leaf.shape), shape, spec, key))
        return replicated(mesh)

    return jax.tree_util.tree_map_with_path(pick, tree)


def _spec_for(leaf_shape: tuple[int, ...], param_shape: tuple[int, ...], spec: P,
              key: tuple[str, ...]) -> P:
    full = tuple(spec) + (None,) * (len(param_shape) - len(spec))
    if leaf_shape == param_shape:
        return P(*full)
    if len(leaf_shape) != len(param_shape) - 1:
        return P()
    # optax's Adafactor factors the two largest dims (d1, d0 = argsort(shape)[-2:]): v_row
    # drops d0, v_col drops d1. Knowing which matters when the two dims are equal.
    order = np.argsort(param_shape)
    candidates = [int(order[-1])] if "v_row" in key else [int(order[-2])] if "v_col" in key else []
    candidates += list(range(len(param_shape)))
    for i in candidates:
        if param_shape[:i] + param_shape[i + 1:] == leaf_shape:
            return P(*(full[:i] + full[i + 1:]))
    return P()


def global_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """This process's rows (numpy) -> global jax arrays sharded over 'data'."""
    sharding = batch_sharding(mesh)
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}


# ---------------------------------------------------------------------------- reporting
def _bytes_per_device(shape: Sequence[int], dtype: Any, sharding: NamedSharding) -> int:
    shard = sharding.shard_shape(tuple(shape))
    return int(np.prod(shard)) * np.dtype(dtype).itemsize


def parameter_table(boxed_params: Any, shardings: Any) -> tuple[str, int]:
    """A table of every parameter's shape, logical axes and mesh spec, and the total bytes
    each device holds."""
    rows = []
    total = 0
    leaves = jax.tree_util.tree_leaves_with_path(
        boxed_params, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    for (path, box), sharding in zip(leaves, jax.tree_util.tree_leaves(shardings)):
        value = box.value if isinstance(box, nn.Partitioned) else box
        names = box.names if isinstance(box, nn.Partitioned) else (None,) * len(value.shape)
        per_device = _bytes_per_device(value.shape, value.dtype, sharding)
        total += per_device
        rows.append(("/".join(_path_key(path)).replace("/value", ""), str(tuple(value.shape)),
                     str(tuple(names)), str(tuple(sharding.spec)), f"{per_device:,}"))
    header = ("parameter", "shape", "logical axes", "mesh axes", "bytes/device")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.append(f"total parameter bytes per device: {total:,}")
    return "\n".join(lines), total


def state_bytes_per_device(tree: Any, shardings: Any) -> int:
    return sum(_bytes_per_device(x.shape, x.dtype, s) for x, s in
               zip(jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(shardings)))


def describe_mesh(mesh: Mesh) -> str:
    platform = mesh.devices.flat[0].platform
    return f"mesh {dict(mesh.shape)} over {mesh.devices.size} {platform} devices"
