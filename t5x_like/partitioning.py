"""Device mesh, logical-axis rules and the shardings of everything a step touches.

The model names every parameter axis (`embed`, `mlp`, `heads`, `kv`, `vocab`,
`relpos_buckets`) and the key activations (`batch`, `length`, `embed`, `vocab`); the rules here
map those names onto the mesh axes (`('data', 'model')` by default; more with
`make_mesh.axis_names`). A layout is a list of rules, so data parallelism, tensor (model)
parallelism and FSDP are configuration, not code paths:

  data_parallel   batch -> data; everything else replicated
  model_parallel  batch -> data; heads, mlp, vocab -> model (Mesh-TensorFlow's T5 layout)
  fsdp            model_parallel + parameters' `embed` axis -> data, so parameters and
                  optimizer state are split over every device
  hybrid_fsdp     for a 3-axis mesh ('data', 'fsdp', 'model'): batch -> (data, fsdp),
                  `embed` -> fsdp, heads/mlp/vocab -> model. Parameters are split within an
                  'fsdp' group and replicated across 'data' (e.g. across slices joined by the
                  slower data-centre network), so only gradients cross the 'data' axis.

The batch is split over whichever mesh axes the rule for the logical name `batch` names.

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
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from t5x_like.errors import ConfigError

Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

# Logical names that never shard (small tables, per-head sizes, sequence positions, BERT's
# position/segment tables, classifier outputs, and the layer axis of a scanned stack).
_ALWAYS_REPLICATED: Rules = (
    ("kv", None),
    ("relpos_buckets", None),
    ("length", None),
    ("positions", None),
    ("segments", None),
    ("classes", None),
    ("layers", None),
)

LAYOUTS: dict[str, Rules] = {
    "data_parallel": (
        ("batch", "data"),
        ("vocab", None),
        ("embed", None),
        ("mlp", None),
        ("heads", None),
    )
    + _ALWAYS_REPLICATED,
    "model_parallel": (
        ("batch", "data"),
        ("vocab", "model"),
        ("mlp", "model"),
        ("heads", "model"),
        ("embed", None),
    )
    + _ALWAYS_REPLICATED,
    "fsdp": (
        ("batch", "data"),
        ("vocab", "model"),
        ("mlp", "model"),
        ("heads", "model"),
        ("embed", "data"),
    )
    + _ALWAYS_REPLICATED,
    "hybrid_fsdp": (
        ("batch", ("data", "fsdp")),
        ("vocab", "model"),
        ("mlp", "model"),
        ("heads", "model"),
        ("embed", "fsdp"),
    )
    + _ALWAYS_REPLICATED,
}
DEFAULT_AXIS_NAMES = ("data", "model")


@gin.configurable
def logical_axis_rules(
    layout: str = "auto", num_partitions: int = 1, overrides: Sequence[tuple[str, Any]] = ()
) -> Rules:
    """The rules of a named layout; `overrides` come first, so they win.

    layout 'auto' is model_parallel when the model axis has more than one device, else
    data_parallel.
    """
    if layout == "auto":
        layout = "model_parallel" if num_partitions > 1 else "data_parallel"
    if layout not in LAYOUTS:
        raise ConfigError(f"Unknown layout {layout!r}; choose one of {sorted(LAYOUTS)} or 'auto'.")
    return tuple(tuple(r) for r in overrides) + LAYOUTS[layout]


@gin.configurable
def make_mesh(
    num_partitions: int = 1,
    mesh_shape: Sequence[int] | None = None,
    devices: Sequence[jax.Device] | None = None,
    axis_names: Sequence[str] = DEFAULT_AXIS_NAMES,
    model_parallel_submesh: Sequence[int] | None = None,
) -> Mesh:
    """A device mesh over all devices, with axes ('data', 'model') unless `axis_names` says
    otherwise.

    Give one of
      * `num_partitions`: devices per model replica; data = devices / num_partitions;
      * `model_parallel_submesh` (t5x's setting, TPU): the physical block (x, y, z, core) of
        chips that holds one model replica, so model-parallel collectives stay on neighbouring
        chips; the 'data' axis runs over the blocks. Off TPU (no chip coordinates) it only sets
        num_partitions = x*y*z*core;
      * `mesh_shape`: one size per axis in `axis_names` (required for more than two axes).
    Without a submesh, devices are laid out with jax's mesh utilities, so on a TPU slice
    neighbouring devices share a model replica.
    """
    devices = list(devices if devices is not None else jax.devices())
    n = len(devices)
    axis_names = tuple(axis_names)
    if "data" not in axis_names or len(set(axis_names)) != len(axis_names):
        raise ConfigError(
            f"make_mesh.axis_names={axis_names} must be distinct names and "
            "include 'data' (the axis the batch is split over by default)."
        )
    if model_parallel_submesh is not None:
        if axis_names != DEFAULT_AXIS_NAMES or mesh_shape is not None:
            raise ConfigError(
                "model_parallel_submesh builds a ('data', 'model') mesh; do not "
                "combine it with mesh_shape or other axis_names."
            )
        grid = submesh_device_grid(devices, model_parallel_submesh)
        return Mesh(grid, DEFAULT_AXIS_NAMES)
    if mesh_shape is not None:
        shape = tuple(int(d) for d in mesh_shape)
        if len(shape) != len(axis_names) or math.prod(shape) != n:
            raise ConfigError(
                f"mesh_shape={shape} does not match the {n} devices and the "
                f"axes {axis_names}: give one size per axis with product {n}."
            )
    else:
        if len(axis_names) != 2:
            raise ConfigError(
                f"A mesh with axes {axis_names} needs an explicit "
                "make_mesh.mesh_shape (one size per axis)."
            )
        if num_partitions < 1 or n % num_partitions:
            raise ConfigError(
                f"num_partitions={num_partitions} does not divide the {n} "
                f"devices; choose a divisor of {n}."
            )
        shape = (n // num_partitions, num_partitions)
    try:
        grid = mesh_utils.create_device_mesh(shape, devices)
    except (AssertionError, ValueError, NotImplementedError):
        grid = np.array(devices).reshape(shape)
    return Mesh(grid, axis_names)


def submesh_device_grid(devices: Sequence[Any], submesh: Sequence[int]) -> np.ndarray:
    """A (data, model) grid in which each row (one model replica) is a contiguous physical
    block of `submesh` = (x, y, z, core) on the TPU torus.

    Devices without `coords` (CPU, GPU) have no torus: the submesh only fixes the number of
    partitions and the devices keep their order.
    """
    submesh = tuple(int(s) for s in submesh)
    if len(submesh) != 4 or min(submesh) < 1:
        raise ConfigError(
            f"model_parallel_submesh={submesh} must be four positive sizes "
            "(x, y, z, core), e.g. (2, 2, 1, 2)."
        )
    n, m = len(devices), math.prod(submesh)
    if n % m:
        raise ConfigError(
            f"model_parallel_submesh={submesh} holds {m} devices, which does not "
            f"divide the {n} devices; choose a block whose size divides {n}."
        )
    if not all(hasattr(d, "coords") for d in devices):
        return np.array(devices, dtype=object).reshape(n // m, m)
    coords = np.array([tuple(d.coords) + (getattr(d, "core_on_chip", 0),) for d in devices])
    physical = tuple(int(c) for c in coords.max(axis=0) + 1)
    if math.prod(physical) != n:
        raise ConfigError(
            f"The {n} devices do not fill a {physical} (x, y, z, core) torus; "
            "model_parallel_submesh needs a whole slice."
        )
    if any(p % s for p, s in zip(physical, submesh)):
        raise ConfigError(
            f"model_parallel_submesh={submesh} does not tile the slice's "
            f"physical mesh {physical} (x, y, z, core); each size must divide "
            "the slice's."
        )
    grid = np.empty(physical, dtype=object)
    for device, c in zip(devices, coords):
        grid[tuple(c)] = device
    # (X, Y, Z, C) -> (X/sx, sx, Y/sy, sy, ...) -> blocks first, then positions inside a block.
    split = [d for p, s in zip(physical, submesh) for d in (p // s, s)]
    blocks = grid.reshape(split).transpose(0, 2, 4, 6, 1, 3, 5, 7)
    return blocks.reshape(n // m, m)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def model_axis_size(mesh: Mesh) -> int:
    """Devices per model replica along 'model' (1 when the mesh has no such axis)."""
    return int(mesh.shape.get("model", 1))


def batch_axes(mesh: Mesh, rules: Rules | None = None) -> tuple[str, ...]:
    """The mesh axes the batch is split over: what the rules map the logical name `batch`
    to ('data' without rules)."""
    target: Any = "data"
    for name, axes in rules or ():
        if name == "batch":
            target = axes
            break
    axes = () if target is None else (target,) if isinstance(target, str) else tuple(target)
    return tuple(a for a in axes if a in mesh.shape)


def batch_sharding(mesh: Mesh, rules: Rules | None = None) -> NamedSharding:
    """Leading (batch) dimension split over the batch axes."""
    axes = batch_axes(mesh, rules)
    return NamedSharding(mesh, P(axes if len(axes) > 1 else axes[0] if axes else None))


def check_batch_size(
    batch_size: int, mesh: Mesh, num_microbatches: int = 1, rules: Rules | None = None
) -> None:
    axes = batch_axes(mesh, rules)
    data = math.prod(mesh.shape[a] for a in axes)
    if batch_size % (data * num_microbatches):
        raise ConfigError(
            f"The batch size (Data.batch_size) {batch_size} must be divisible by the "
            f"data-parallel size ({data}, mesh "
            f"axes {axes}) x num_microbatches ({num_microbatches}) = {data * num_microbatches}."
        )


def check_rules_match_mesh(rules: Rules, mesh: Mesh) -> None:
    """Every mesh axis a rule names must exist, else flax fails deep inside jit."""
    for name, axes in rules:
        named = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
        unknown = [a for a in named if a not in mesh.shape]
        if unknown:
            raise ConfigError(
                f"The rule ({name!r}, {axes!r}) names mesh axis {unknown[0]!r}, but the mesh "
                f"has axes {tuple(mesh.axis_names)}; set make_mesh.axis_names (and mesh_shape) "
                "to include it, or pick a layout for this mesh."
            )


# ---------------------------------------------------------------------------- parameters
def _check_rules_cover(boxed_params: Any, rules: Rules) -> None:
    named = {name for name, _ in rules}
    for path, box in jax.tree_util.tree_leaves_with_path(
        boxed_params, is_leaf=lambda x: isinstance(x, nn.Partitioned)
    ):
        if not isinstance(box, nn.Partitioned):
            continue
        missing = [a for a in box.names if a is not None and a not in named]
        if missing:
            raise ConfigError(
                f"Logical axis {missing[0]!r} of parameter {jax.tree_util.keystr(path)} has no "
                f"partitioning rule; add ('{missing[0]}', None) or a mesh axis to "
                "logical_axis_rules.overrides."
            )


def param_shardings(boxed_params: Any, mesh: Mesh, rules: Rules) -> Any:
    """NamedShardings (unboxed tree) for parameters that carry logical axis names."""
    check_rules_match_mesh(rules, mesh)
    _check_rules_cover(boxed_params, rules)
    specs = nn.get_partition_spec(boxed_params)
    shardings = nn.logical_to_mesh_sharding(specs, mesh, list(rules))
    _check_divisible(boxed_params, shardings)
    return shardings


def _check_divisible(boxed_params: Any, shardings: Any) -> None:
    leaves = jax.tree_util.tree_leaves_with_path(
        boxed_params, is_leaf=lambda x: isinstance(x, nn.Partitioned)
    )
    for (path, box), sharding in zip(leaves, jax.tree_util.tree_leaves(shardings)):
        shape = box.value.shape if isinstance(box, nn.Partitioned) else box.shape
        for dim, axes in zip(shape, tuple(sharding.spec)):
            if axes is None:
                continue
            ways = math.prod(
                sharding.mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes)
            )
            if dim % ways:
                raise ConfigError(
                    f"Parameter {jax.tree_util.keystr(path)} of shape {tuple(shape)} cannot be "
                    f"split {ways} ways over mesh axis {axes!r} (size {dim}); pick a mesh whose "
                    f"{axes!r} axis divides {dim}, or a layout that leaves it replicated."
                )


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
    for (path, p), s in zip(
        jax.tree_util.tree_leaves_with_path(params), jax.tree_util.tree_leaves(shardings)
    ):
        by_path[_path_key(path)] = (tuple(p.shape), s.spec)

    def pick(path, leaf):
        key = _path_key(path)
        for start in range(len(key)):
            if key[start:] in by_path:
                shape, spec = by_path[key[start:]]
                return NamedSharding(mesh, _spec_for(tuple(leaf.shape), shape, spec, key))
        return replicated(mesh)

    return jax.tree_util.tree_map_with_path(pick, tree)


def _spec_for(
    leaf_shape: tuple[int, ...], param_shape: tuple[int, ...], spec: P, key: tuple[str, ...]
) -> P:
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
        if param_shape[:i] + param_shape[i + 1 :] == leaf_shape:
            return P(*(full[:i] + full[i + 1 :]))
    return P()


def global_batch(
    batch: dict[str, np.ndarray], mesh: Mesh, rules: Rules | None = None
) -> dict[str, jax.Array]:
    """This process's rows (numpy) -> global jax arrays split over the batch axes."""
    sharding = batch_sharding(mesh, rules)
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
        boxed_params, is_leaf=lambda x: isinstance(x, nn.Partitioned)
    )
    for (path, box), sharding in zip(leaves, jax.tree_util.tree_leaves(shardings)):
        value = box.value if isinstance(box, nn.Partitioned) else box
        names = box.names if isinstance(box, nn.Partitioned) else (None,) * len(value.shape)
        per_device = _bytes_per_device(value.shape, value.dtype, sharding)
        total += per_device
        rows.append(
            (
                "/".join(_path_key(path)).removesuffix("/value"),
                str(tuple(value.shape)),
                str(tuple(names)),
                str(tuple(sharding.spec)),
                f"{per_device:,}",
            )
        )
    header = ("parameter", "shape", "logical axes", "mesh axes", "bytes/device")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.append(f"total parameter bytes per device: {total:,}")
    return "\n".join(lines), total


def state_bytes_per_device(tree: Any, shardings: Any) -> int:
    return sum(
        _bytes_per_device(x.shape, x.dtype, s)
        for x, s in zip(jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(shardings))
    )


def describe_mesh(mesh: Mesh) -> str:
    platform = mesh.devices.flat[0].platform
    return f"mesh {dict(mesh.shape)} over {mesh.devices.size} {platform} devices"
