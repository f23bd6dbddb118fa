"""Two real processes on localhost (jax.distributed with a local coordinator, gloo collectives
on CPU) train on one global batch and reach the losses of a single process."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from t5x_like import logs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "multiprocess_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env():
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # each worker sets its own device count
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.mark.slow  # three processes compiling the model (~70 s)
def test_two_processes_match_one(tmp_path):
    port = _free_port()
    two = tmp_path / "two.json"
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, str(i), "2", str(port), "2", str(two)],
            cwd=ROOT,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-2000:] for o in outputs)
    one = tmp_path / "one.json"
    single = subprocess.run(
        [sys.executable, WORKER, "0", "1", "0", "4", str(one)],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert single.returncode == 0, single.stdout[-2000:] + single.stderr[-2000:]
    multi, ref = json.loads(two.read_text()), json.loads(one.read_text())
    assert multi["processes"] == 2 and multi["devices"] == 4 and ref["processes"] == 1
    np.testing.assert_allclose(multi["losses"], ref["losses"], rtol=1e-5)


@pytest.mark.slow  # two training processes
def test_two_process_training_run_logs_process_ids_and_one_writer(tmp_path):
    """`python -m t5x_like.train` as two processes (the T5X_LIKE_COORDINATOR settings the GPU
    launcher uses): both finish, every log line names its process, and only process 0 writes
    TensorBoard summaries (process 1 logs them to its console only)."""
    from tests.test_train import TINY_RUN

    port = _free_port()
    model_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "t5x_like.train",
        "--gin_file=gin_configs/runs/quickstart.gin",
        *[f"--gin.{b}" for b in TINY_RUN],
        f"--gin.MODEL_DIR={model_dir}",
        "--gin.TRAIN_STEPS=4",
        "--gin.train.log_every=2",
        "--gin.Evaluation.loss_every=0",
        "--gin.Evaluation.num_predictions=0",
        "--gin.Checkpointing.every=4",
    ]
    procs = []
    for i in range(2):
        env = {
            **_env(),
            "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
            "T5X_LIKE_COORDINATOR": f"127.0.0.1:{port}",
            "T5X_LIKE_NUM_PROCESSES": "2",
            "T5X_LIKE_PROCESS_ID": str(i),
        }
        procs.append(
            subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
            )
        )
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-2000:] for o in outputs)
    for i, out in enumerate(outputs):
        steps = [line for line in logs.unstamped(out) if "step       4  loss" in line]
        assert steps and all(line.startswith(f"[process {i}/2] ") for line in steps), out[-1500:]
    events = [f for f in os.listdir(model_dir / "tensorboard") if f.startswith("events.out")]
    assert len(events) == 1, events
    assert (model_dir / "checkpoints" / "4").is_dir()


# --- When to call jax.distributed.initialize: the environment and the Compute Engine metadata
# server faked (a local FakeMetadataServer answering the attributes Cloud TPU VMs have), and
# jax.distributed.initialize replaced by a recorder.

from t5x_like import distributed  # noqa: E402
from t5x_like.errors import ConfigError  # noqa: E402
from tests.fake_metadata_server import FakeMetadataServer  # noqa: E402

LAUNCH_ENV = (
    "T5X_LIKE_COORDINATOR",
    "T5X_LIKE_NUM_PROCESSES",
    "T5X_LIKE_PROCESS_ID",
    "SLURM_NTASKS",
    "SLURM_STEP_NUM_NODES",
    "SLURM_NNODES",
    "SLURM_GPUS_ON_NODE",
    "TPU_WORKER_HOSTNAMES",
    "TPU_PROCESS_ADDRESSES",
    "MEGASCALE_NUM_SLICES",
    distributed.METADATA_HOST_ENV,
)
# Cloud TPU's worker-network-endpoints, in its name:id:ip form: a v4-32 slice has 4 hosts.
V4_32_ENDPOINTS = ",".join(f"t1v-n-abc-w-{i}:8470:10.128.0.{10 + i}" for i in range(4))


class Jax:
    """What the test lets jax.distributed report: `calls` records initialize's arguments."""

    def __init__(self, monkeypatch):
        import jax

        self.calls, self.processes = [], 1
        monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
        monkeypatch.setattr(
            jax.distributed, "initialize", lambda **kwargs: self.calls.append(kwargs)
        )
        monkeypatch.setattr(jax, "process_count", lambda: self.processes)
        monkeypatch.setattr(jax.config, "update", lambda *args: None)


@pytest.fixture
def fake_jax(monkeypatch):
    for name in LAUNCH_ENV:
        monkeypatch.delenv(name, raising=False)
    return Jax(monkeypatch)


@pytest.fixture
def metadata(monkeypatch):
    """A fake metadata server that `distributed` (and jax) will ask; set its attributes."""
    with FakeMetadataServer() as server:
        monkeypatch.setenv(distributed.METADATA_HOST_ENV, server.host)
        yield server


def test_single_host_tpu_vm_does_not_initialise(fake_jax, metadata):
    metadata.attributes.update(
        {
            "accelerator-type": "v4-8",
            "agent-worker-number": "0",
            "worker-network-endpoints": "t1v-n-abc-w-0:8470:10.128.0.10",
        }
    )
    assert distributed.initialize() is False
    assert fake_jax.calls == []
    assert metadata.requests >= 1  # it did ask


@pytest.mark.parametrize("endpoints", [V4_32_ENDPOINTS, "w-0,w-1,w-2,w-3"])
def test_pod_slice_initialises_from_the_metadata(fake_jax, metadata, endpoints):
    """A gcloud-made v4-32 has no TPU_WORKER_HOSTNAMES, only the metadata's four workers;
    jax.distributed.initialize() is called with no arguments (jax reads the metadata)."""
    metadata.attributes.update(
        {
            "accelerator-type": "v4-32",
            "agent-worker-number": "2",
            "worker-network-endpoints": endpoints,
        }
    )
    fake_jax.processes = 4
    assert distributed.initialize() is True
    assert fake_jax.calls == [{}]


def test_worker_list_reads_as_jax_reads_it(metadata):
    """Our reading of worker-network-endpoints against jax's own (GceTpuCluster), on the
    same fake metadata through the GCE_METADATA_IP variable both honour."""
    from jax._src.clusters import cloud_tpu_cluster

    metadata.attributes.update(
        {
            "accelerator-type": "v4-32",
            "agent-worker-number": "2",
            "worker-network-endpoints": V4_32_ENDPOINTS,
        }
    )
    ours = distributed.tpu_slice()
    assert list(ours.workers) == cloud_tpu_cluster.GceTpuCluster._get_worker_list_in_slice()
    assert ours.workers == ("10.128.0.10", "10.128.0.11", "10.128.0.12", "10.128.0.13")
    assert ours.worker_number == cloud_tpu_cluster.GceTpuCluster._get_process_id_in_slice() == 2


def test_a_process_count_unlike_the_slice_is_a_clear_error(fake_jax, metadata):
    metadata.attributes.update(
        {
            "accelerator-type": "v4-32",
            "agent-worker-number": "0",
            "worker-network-endpoints": V4_32_ENDPOINTS,
        }
    )
    fake_jax.processes = 1
    with pytest.raises(
        ConfigError,
        match=r"v4-32\) has 4 workers, but jax.distributed "
        r"started 1 processes.*--worker=all",
    ):
        distributed.initialize()


def test_multislice_counts_every_slice(fake_jax, metadata):
    """tpu-env's MEGASCALE_NUM_SLICES (jax's get_tpu_env_value): 2 slices x 4 workers."""
    metadata.attributes.update(
        {
            "accelerator-type": "v4-32",
            "agent-worker-number": "1",
            "worker-network-endpoints": V4_32_ENDPOINTS,
            "tpu-env": "ACCELERATOR_TYPE: 'v4-32'\nMEGASCALE_NUM_SLICES: '2'\n",
        }
    )
    fake_jax.processes = 8
    assert distributed.initialize() is True
    fake_jax.processes = 4
    with pytest.raises(ConfigError, match="has 8 workers"):
        distributed.initialize()


def test_a_gce_vm_without_a_tpu_does_not_initialise(fake_jax, metadata):
    """A plain Compute Engine VM: the server answers 404 for accelerator-type."""
    assert distributed.initialize() is False
    assert fake_jax.calls == [] and metadata.paths == [
        "/computeMetadata/v1/instance/attributes/accelerator-type"
    ]


def test_off_google_cloud_nothing_is_asked(fake_jax, monkeypatch):
    import urllib.request

    monkeypatch.setattr(distributed, "on_google_cloud", lambda: False)
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: pytest.fail("asked"))
    assert distributed.initialize() is False and fake_jax.calls == []


def test_no_metadata_server_is_not_a_tpu_vm(fake_jax, monkeypatch):
    monkeypatch.setenv(distributed.METADATA_HOST_ENV, f"127.0.0.1:{_free_port()}")  # closed
    assert distributed.tpu_slice() is None
    assert distributed.initialize() is False and fake_jax.calls == []


def test_explicit_coordinator_comes_first(fake_jax, metadata, monkeypatch):
    metadata.attributes.update(
        {"accelerator-type": "v4-32", "worker-network-endpoints": V4_32_ENDPOINTS}
    )
    monkeypatch.setenv("T5X_LIKE_COORDINATOR", "10.0.0.1:1234")
    monkeypatch.setenv("T5X_LIKE_NUM_PROCESSES", "2")
    monkeypatch.setenv("T5X_LIKE_PROCESS_ID", "1")
    assert distributed.initialize() is True
    assert fake_jax.calls == [
        {"coordinator_address": "10.0.0.1:1234", "num_processes": 2, "process_id": 1}
    ]
    assert metadata.requests == 0


@pytest.mark.parametrize(
    "tasks,nodes,gpus,expected",
    [
        ("16", "2", "8", [{"local_device_ids": None}]),  # a task per GPU: jax's choice
        ("2", "2", "8", [{"local_device_ids": list(range(8))}]),  # a task per node: all its GPUs
        ("1", "1", "8", []),  # one task: nothing to join
    ],
)
def test_slurm(fake_jax, monkeypatch, tasks, nodes, gpus, expected):
    monkeypatch.setattr(distributed, "on_google_cloud", lambda: False)
    monkeypatch.setenv("SLURM_NTASKS", tasks)
    monkeypatch.setenv("SLURM_STEP_NUM_NODES", nodes)
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", gpus)
    assert distributed.initialize() is bool(expected)
    assert fake_jax.calls == expected


def test_gke_pod(fake_jax, monkeypatch):
    monkeypatch.setattr(distributed, "on_google_cloud", lambda: False)
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "w-0,w-1,w-2,w-3")
    fake_jax.processes = 4
    assert distributed.initialize() is True and fake_jax.calls == [{}]
    fake_jax.processes = 2
    with pytest.raises(ConfigError, match="has 4 workers, but jax.distributed started 2"):
        distributed.initialize()


def test_the_command_line_reports_the_mismatch(fake_jax, metadata, capsys):
    from t5x_like import cli

    metadata.attributes.update(
        {"accelerator-type": "v4-32", "worker-network-endpoints": V4_32_ENDPOINTS}
    )
    assert cli.run(lambda: pytest.fail("ran"), [], "test") == 2
    assert "has 4 workers, but jax.distributed started 1" in capsys.readouterr().err
