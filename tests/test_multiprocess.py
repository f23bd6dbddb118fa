"""Two real processes on localhost (jax.distributed with a local coordinator, gloo collectives
on CPU) train on one global batch and reach the losses of a single process."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

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
    procs = [subprocess.Popen([sys.executable, WORKER, str(i), "2", str(port), "2", str(two)],
                              cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-2000:] for o in outputs)
    one = tmp_path / "one.json"
    single = subprocess.run([sys.executable, WORKER, "0", "1", "0", "4", str(one)], cwd=ROOT,
                            env=_env(), capture_output=True, text=True, timeout=300)
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
    cmd = [sys.executable, "-m", "t5x_like.train", "--gin_file=gin_configs/runs/quickstart.gin",
           *[f"--gin.{b}" for b in TINY_RUN], f"--gin.MODEL_DIR={model_dir}",
           "--gin.TRAIN_STEPS=4", "--gin.train.log_every=2", "--gin.train.eval_every=0",
           "--gin.train.num_predictions=0", "--gin.train.checkpoint_every=4"]
    procs = []
    for i in range(2):
        env = {**_env(), "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
               "T5X_LIKE_COORDINATOR": f"127.0.0.1:{port}", "T5X_LIKE_NUM_PROCESSES": "2",
               "T5X_LIKE_PROCESS_ID": str(i)}
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True))
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-2000:] for o in outputs)
    for i, out in enumerate(outputs):
        steps = [line for line in out.splitlines() if "step       4  loss" in line]
        assert steps and all(line.startswith(f"[process {i}/2] ") for line in steps), out[-1500:]
    events = [f for f in os.listdir(model_dir / "tensorboard") if f.startswith("events.out")]
    assert len(events) == 1, events
    assert (model_dir / "checkpoints" / "4").is_dir()
