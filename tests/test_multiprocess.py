"""Two real processes on localhost (jax.distributed with a local coordinator, gloo collectives
on CPU) train on one global batch and reach the losses of a single process."""

import json
import os
import socket
import subprocess
import sys

import numpy as np

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
