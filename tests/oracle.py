"""Run the released reference code (the T5 library, Google's BERT, transformers 4.57.6's
checkpoint loaders) in a process of its own.

The data-path tests compare our output with the reference implementations' output on the same
input. Those packages live in `.venv/oracles` (requirements/oracles.txt) and
`.venv/oracles_transformers4` (requirements/oracles_transformers4.txt), installed without
their dependencies by launch/_venv.sh, and never on the tests' own path: the T5 library
registers seqio tasks under the same names as ours, and transformers 4 is older than the
venv's, so each oracle runs as a separate Python process with its folder first on its path.

An oracle is a script in `tests/oracles/` that reads one JSON payload from stdin and writes one
JSON result to stdout (`oracle_main` below does both, with the network blocked as in the
tests' own process).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any, Callable

REPO = pathlib.Path(__file__).resolve().parent.parent
ORACLE_SCRIPTS = REPO / "tests" / "oracles"


# The two sets of reference packages: the released T5 library and Google's BERT code
# (requirements/oracles.txt), and transformers 4.57.6, the last release with the loaders of the
# original checkpoint formats (requirements/oracles_transformers4.txt). {set: (its folder under
# .venv, its requirements file, the packages that show it is installed)}.
REFERENCE = "oracles"
TRANSFORMERS4 = "oracles_transformers4"
_SETS = {
    REFERENCE: ("requirements/oracles.txt", ("t5", "bert")),
    TRANSFORMERS4: ("requirements/oracles_transformers4.txt", ("transformers",)),
}


def oracle_dir(packages: str = REFERENCE) -> pathlib.Path:
    """Where a set of reference packages is installed (T5X_LIKE_ORACLES overrides the first)."""
    if packages == REFERENCE and "T5X_LIKE_ORACLES" in os.environ:
        return pathlib.Path(os.environ["T5X_LIKE_ORACLES"])
    return REPO / ".venv" / packages


def run_oracle(script: str, payload: Any, timeout: float = 600, packages: str = REFERENCE) -> Any:
    """Run tests/oracles/<script>.py on `payload` (JSON) with the reference code of `packages`
    (REFERENCE or TRANSFORMERS4) importable ahead of the venv's own."""
    requirements, names = _SETS[packages]
    folder = oracle_dir(packages)
    if not all((folder / name).is_dir() for name in names):
        raise RuntimeError(
            f"The reference code is not installed in {folder}: run `bash launch/test.sh` "
            f"(it installs {requirements}), or `pip install --no-deps --target "
            f"{folder} -r {requirements}`."
        )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(folder), str(REPO)])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env["CUDA_VISIBLE_DEVICES"] = ""
    done = subprocess.run(
        [sys.executable, str(ORACLE_SCRIPTS / f"{script}.py")],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=str(REPO),
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"oracle {script} failed (exit {done.returncode}):\n{done.stderr[-6000:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def jsonable(value: Any) -> Any:
    """Tuples as lists, NumPy scalars as Python numbers, bytes as text: what JSON can carry
    between the tests and an oracle."""
    import numpy as np

    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.generic):
        return value.item()
    return value


def oracle_main(compute: Callable[[Any], Any]) -> None:
    """The body of an oracle script: payload from stdin, result as the last stdout line."""
    import socket

    from tests import network

    socket.socket.connect = network.guarded_connect
    payload = json.loads(sys.stdin.read())
    result = compute(payload)
    sys.stdout.write("\n" + json.dumps(result) + "\n")
