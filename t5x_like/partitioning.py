"""Device mesh and shardings.

Batches are split over the 'data' axis; parameters and optimizer state are replicated for now
(logical-axis rules for model parallelism and FSDP map onto the 'model' axis next). Every jitted
step takes its shardings from here, so a layout change is a config change, not a code change.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from t5x_like.config import ConfigError


def make_mesh(num_partitions: int = 1, devices: list[jax.Device] | None = None) -> Mesh:
    """A ('data', 'model') mesh over all devices; `num_partitions` devices per model replica."""
    devices = list(devices if devices is not None else jax.devices())
    if num_partitions < 1 or len(devices) % num_partitions:
        raise ConfigError(
            f"num_partitions={num_partitions} does not divide the {len(devices)} available "
            f"devices; choose a divisor of {len(devices)}.")
    grid = np.array(devices).reshape(len(devices) // num_partitions, num_partitions)
    return Mesh(grid, ("data", "model"))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) dimension split over 'data'."""
    return NamedSharding(mesh, P("data"))


def check_batch_size(batch_size: int, mesh: Mesh) -> None:
    data_parallel = mesh.shape["data"]
    if batch_size % data_parallel:
        raise ConfigError(f"batch_size={batch_size} is not divisible by the {data_parallel} "
                         "data-parallel replicas; pick a multiple of it.")


def global_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Host numpy arrays (this process's rows) -> global jax arrays sharded over 'data'."""
    sharding = batch_sharding(mesh)
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}


def tree_replicated(tree: Any, mesh: Mesh) -> Any:
    return jax.tree_util.tree_map(lambda _: replicated(mesh), tree)
