"""Multi-process start-up: `jax.distributed.initialize` whenever more than one process runs.

Three ways a run becomes multi-process: explicit coordinator settings (gin or the
T5X_LIKE_COORDINATOR / _NUM_PROCESSES / _PROCESS_ID environment variables), a SLURM job with
several tasks, or a Cloud TPU VM pod slice (jax finds its peers from the TPU metadata). A single
process on one host does nothing here.
"""

from __future__ import annotations

import os

import gin
import jax


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else None


@gin.configurable
def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> bool:
    """Join the other processes of this run; returns True if jax.distributed was initialised."""
    coordinator_address = coordinator_address or os.environ.get("T5X_LIKE_COORDINATOR")
    num_processes = num_processes or _env_int("T5X_LIKE_NUM_PROCESSES")
    if process_id is None:
        process_id = _env_int("T5X_LIKE_PROCESS_ID")
    if jax.distributed.is_initialized():
        return True
    if coordinator_address:
        # Cross-process collectives for CPU devices (harmless where accelerators do the work).
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=coordinator_address,
                                   num_processes=num_processes, process_id=process_id)
        return True
    slurm_tasks = _env_int("SLURM_NTASKS")
    tpu_pod = len([h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]) > 1
    if (slurm_tasks and slurm_tasks > 1) or tpu_pod:
        jax.distributed.initialize()  # jax reads SLURM / TPU metadata itself
        return True
    return False
