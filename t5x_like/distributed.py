"""Multi-process start-up: `jax.distributed.initialize` whenever more than one process runs.

Four ways a run becomes multi-process: explicit coordinator settings (gin or the
T5X_LIKE_COORDINATOR / _NUM_PROCESSES / _PROCESS_ID environment variables), a SLURM job with
several tasks, a GKE TPU pod (TPU_WORKER_HOSTNAMES / TPU_PROCESS_ADDRESSES, set by GKE), or a
Cloud TPU VM pod slice made with gcloud, which sets no such variable: there the Compute Engine
metadata server tells (`accelerator-type` says it is a TPU VM, `worker-network-endpoints` lists
one entry per worker). In the three automatic cases jax itself finds its peers (jax's
`clusters/slurm_cluster.py` and `clusters/cloud_tpu_cluster.py`); this module only decides
that it must be asked, reading the same variables and metadata attributes jax reads. A single
process on one host does nothing here.

Without initialising, every worker of a pod slice would believe it is process 0 of 1: each
would write checkpoints and summaries, and the preemption sync point would never be reached
together. So after initialising on a TPU slice the process count is checked against the
slice's worker count.
"""

from __future__ import annotations

import dataclasses
import http.client
import os
import urllib.request

import gin
import jax

from t5x_like.errors import ConfigError
from t5x_like.preemption import on_google_cloud

# The metadata server's address; jax's cloud_tpu_cluster.get_metadata (and TensorFlow's GCS
# client) read GCE_METADATA_IP in place of it, so a test's fake server stands in for both.
METADATA_HOST = "metadata.google.internal"
METADATA_HOST_ENV = "GCE_METADATA_IP"
METADATA_TIMEOUT_S = 1.0
# A pod's worker list where GKE starts the job (what jax's GkeTpuCluster reads, first first).
GKE_WORKER_ENVS = ("TPU_PROCESS_ADDRESSES", "TPU_WORKER_HOSTNAMES")


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else None


def metadata_attribute(key: str, timeout_s: float = METADATA_TIMEOUT_S) -> str | None:
    """The instance attribute `key` from the Compute Engine metadata server, or None when
    there is no such attribute (HTTP 404: a VM that is not a TPU VM) or no metadata server
    (not on Google Cloud). Off Google Cloud (no GCE_METADATA_IP and a DMI product name that
    is not Google's) nothing is asked at all, so a laptop start never waits on DNS."""
    host = os.environ.get(METADATA_HOST_ENV)
    if not host:
        if not on_google_cloud():
            return None
        host = METADATA_HOST
    request = urllib.request.Request(
        f"http://{host}/computeMetadata/v1/instance/attributes/{key}",
        headers={"Metadata-Flavor": "Google"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.read().decode().strip()
    except (OSError, http.client.HTTPException, RuntimeError):  # 404, refused, timeout, no DNS
        return None


def parse_worker_endpoints(value: str) -> tuple[str, ...]:
    """`worker-network-endpoints`' addresses, one per worker. Cloud TPU writes either bare
    hostnames or `name:id:ip` triples (jax's GceTpuCluster._get_worker_list_in_slice)."""
    addresses = []
    for worker in (w.strip() for w in value.split(",")):
        if not worker:
            continue
        parts = worker.split(":")
        if len(parts) not in (1, 3):
            raise ConfigError(
                f"The TPU metadata's worker-network-endpoints entry {worker!r} "
                "is neither a hostname nor name:id:ip; jax could not read it "
                "either. Set T5X_LIKE_COORDINATOR, T5X_LIKE_NUM_PROCESSES and "
                "T5X_LIKE_PROCESS_ID on every worker instead."
            )
        addresses.append(parts[-1])
    return tuple(addresses)


def parse_tpu_env(value: str, key: str) -> str | None:
    """One `KEY: 'value'` line of the `tpu-env` attribute (jax's
    get_tpu_env_value_from_metadata)."""
    found = None
    for line in value.splitlines():
        if ":" in line:
            name, _, item = line.partition(":")
            if name.strip() == key:
                found = item.strip().strip("'")
    return found


@dataclasses.dataclass(frozen=True)
class TpuSlice:
    """What the metadata server says of this Cloud TPU VM's slice (or slices, multislice)."""

    accelerator_type: str  # e.g. "v4-32"
    workers: tuple[str, ...]  # one address per worker (host) of this slice
    worker_number: int | None  # this host's index among them
    num_slices: int = 1  # MEGASCALE_NUM_SLICES for a multislice job

    @property
    def multi_host(self) -> bool:
        return len(self.workers) > 1 or self.num_slices > 1 or (self.worker_number or 0) > 0

    @property
    def process_count(self) -> int | None:
        """Processes a run on every worker makes (one per host), when the workers are known."""
        return len(self.workers) * self.num_slices if self.workers else None


def _num_slices() -> int:
    value = os.environ.get("MEGASCALE_NUM_SLICES")
    if value is None:
        tpu_env = metadata_attribute("tpu-env")
        value = parse_tpu_env(tpu_env, "MEGASCALE_NUM_SLICES") if tpu_env else None
    return int(value) if value else 1


def tpu_slice() -> TpuSlice | None:
    """This host's Cloud TPU slice, or None when it is not a Cloud TPU VM (no metadata
    server, or one without an `accelerator-type` attribute)."""
    accelerator_type = metadata_attribute("accelerator-type")
    if not accelerator_type:
        return None
    endpoints = metadata_attribute("worker-network-endpoints")
    number = metadata_attribute("agent-worker-number")
    return TpuSlice(
        accelerator_type=accelerator_type,
        workers=parse_worker_endpoints(endpoints) if endpoints else (),
        worker_number=int(number) if number not in (None, "") else None,
        num_slices=_num_slices(),
    )


def _gke_workers() -> tuple[str, ...]:
    for name in GKE_WORKER_ENVS:
        if os.environ.get(name) is not None:
            return tuple(h for h in os.environ[name].split(",") if h)
    return ()


def slurm_local_device_ids() -> list[int] | None:
    """The GPUs a SLURM task drives. jax assumes one task per GPU under SLURM (it keeps only
    GPU number SLURM_LOCALID), so a job with one task per node would leave all but one GPU
    idle: with one task per node, all the node's GPUs (SLURM_GPUS_ON_NODE) are named
    instead. None (jax's choice) otherwise."""
    tasks, nodes = (
        _env_int("SLURM_NTASKS"),
        _env_int("SLURM_STEP_NUM_NODES") or _env_int("SLURM_NNODES"),
    )
    gpus = _env_int("SLURM_GPUS_ON_NODE")
    if tasks and nodes and tasks == nodes and gpus and gpus > 1:
        return list(range(gpus))
    return None


def check_process_count(expected: int | None, where: str) -> None:
    """Fail with what to do when jax.distributed started a different number of processes
    than the slice has workers (a worker not started, or one started twice)."""
    started = jax.process_count()
    if expected is not None and started != expected:
        raise ConfigError(
            f"{where} has {expected} workers, but jax.distributed started {started} "
            f"processes. Start the trainer once on every worker at the same time "
            f"(launch/tpu_vm_run.sh runs it with `gcloud compute tpus tpu-vm ssh "
            f"--worker=all`), and stop any earlier run still holding a worker's TPU."
        )


@gin.configurable
def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> bool:
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
        jax.distributed.initialize(
            coordinator_address=coordinator_address,
            num_processes=num_processes,
            process_id=process_id,
        )
        return True
    slurm_tasks = _env_int("SLURM_NTASKS")
    if slurm_tasks and slurm_tasks > 1:
        jax.distributed.initialize(local_device_ids=slurm_local_device_ids())
        return True
    gke_workers = _gke_workers()
    if len(gke_workers) > 1:
        jax.distributed.initialize()  # jax reads the GKE variables itself
        check_process_count(len(gke_workers), f"This GKE TPU pod ({GKE_WORKER_ENVS[1]})")
        return True
    tpu = tpu_slice()
    if tpu is not None and tpu.multi_host:
        jax.distributed.initialize()  # jax reads the TPU metadata itself
        check_process_count(
            tpu.process_count,
            f"This TPU slice ({tpu.accelerator_type}"
            + (f", {tpu.num_slices} slices" if tpu.num_slices > 1 else "")
            + ")",
        )
        return True
    return False
