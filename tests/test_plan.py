"""The memory planner compiles the sharded train step ahead of time from abstract shapes."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = [
    "--gin",
    "T5Config.vocab_size=256",
    "--gin",
    "T5Config.emb_dim=64",
    "--gin",
    "T5Config.num_heads=4",
    "--gin",
    "T5Config.head_dim=16",
    "--gin",
    "T5Config.mlp_dim=128",
    "--gin",
    "T5Config.num_encoder_layers=2",
    "--gin",
    "T5Config.num_decoder_layers=2",
]


def _plan(tmp_path, *extra, shape=("--batch_size=8", "--inputs=32", "--targets=8")):
    out = tmp_path / "plan.json"
    result = subprocess.run(
        [sys.executable, "-m", "t5x_like.plan", *TINY, *shape, f"--json={out}", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return result, (json.loads(out.read_text()) if out.exists() else None)


def test_planner_reports_sharded_bytes_and_fit(tmp_path):
    result, plan = _plan(tmp_path, "--num_devices=16", "--mesh_shape=4,4", "--layout=fsdp")
    assert result.returncode == 0, result.stderr[-3000:]
    assert plan["num_devices"] == 16 and plan["mesh"] == {"data": 4, "model": 4}
    # T5 v1.0 layout, tied embedding: 256*64 + encoder 2*(4*64*64 + 2*64*128 + 2*64)
    # + decoder 2*(8*64*64 + 2*64*128 + 3*64) + 2 relpos tables 4*32 + 2 final norms.
    total = (
        256 * 64
        + 2 * (4 * 64 * 64 + 2 * 64 * 128 + 2 * 64)
        + 2 * (8 * 64 * 64 + 2 * 64 * 128 + 3 * 64)
        + 2 * 4 * 32
        + 2 * 64
    )
    assert plan["parameters"] == total
    # Matrices are split 16 ways (embed over data, heads/mlp/vocab over model); only norms,
    # relative-position tables and... stay whole, so a device holds a little over 1/16.
    held = plan["bytes_per_device"]["parameters"]
    assert 4 * total / 16 <= held < 4 * total / 16 + 4 * (2 * 4 * 32 + 12 * 64)
    assert plan["bytes_per_device"]["temporaries"] > 0
    assert plan["flops_per_step"] > 6 * total * 8 * 8 / 2  # at least the decoder's matmuls
    assert plan["fits"]["H200"] is True
    # A checkpoint: the float32 parameters whole, plus Adafactor's state, which is at most one
    # float32 slot per parameter plus the factored row and column moments.
    assert 4 * total < plan["checkpoint_bytes"] < 3 * 4 * total
    assert "checkpoint " in result.stdout
    assert "peak estimate" in result.stdout and "TPU v4" in result.stdout


@pytest.mark.slow  # a subprocess (~20 s); the same partitioning check runs in test_sharding
def test_planner_rejects_a_mesh_that_does_not_fit_the_model(tmp_path):
    result, _ = _plan(tmp_path, "--num_devices=8", "--mesh_shape=1,8", "--layout=model_parallel")
    assert result.returncode == 2
    assert "cannot be split 8 ways over mesh axis 'model'" in result.stderr


@pytest.mark.slow
def test_planner_runs_for_t5_11b_on_32_devices(tmp_path):
    """The issue's acceptance case. The layers are scanned (same parameters and sharding, one
    compiled layer per stack): unrolled, the 48 layers take ~12 minutes of single-threaded XLA
    compilation on CPU, scanned ~30 s."""
    out = tmp_path / "plan.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "t5x_like.plan",
            "--gin_file=gin_configs/models/t5_1_0/11B.gin",
            "--gin",
            "T5Config.scan_layers=True",
            "--num_devices=32",
            "--mesh_shape=4,8",
            "--layout=fsdp",
            "--batch_size=128",
            f"--json={out}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    plan = json.loads(out.read_text())
    assert plan["parameters"] == 11_307_321_344
    # FSDP over all 32 devices: each holds 1/32 of the float32 parameters (+ small vectors).
    held = plan["bytes_per_device"]["parameters"]
    assert 4 * 11_307_321_344 / 32 <= held < 1.01 * 4 * 11_307_321_344 / 32


def test_planner_takes_the_runs_settings_from_its_gin_file(tmp_path):
    """Given the run's gin file, the planner plans that run: its batch, feature lengths,
    micro-batches and optimizer, where a flag does not override them (here --targets)."""
    run_gin = tmp_path / "run.gin"
    run_gin.write_text(
        "Data.batch_size = 4\n"
        "Data.task_feature_lengths = {'inputs': 16, 'targets': 4}\n"
        "Optimizer.num_microbatches = 2\n"
        "Optimizer.kind = 'adamw'\n"
    )
    result, plan = _plan(
        tmp_path, "--num_devices=2", f"--gin_file={run_gin}", shape=("--targets=6",)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert plan["batch"] == [4, 16, 6] and plan["num_microbatches"] == 2
    assert plan["optimizer"] == "adamw"
    # Adam keeps two float32 moments per parameter, replicated under data parallelism; the
    # parameters themselves are as many bytes.
    held = plan["bytes_per_device"]
    assert 2 * held["parameters"] <= held["optimizer_state"] < 2 * held["parameters"] + 64


@pytest.mark.slow  # a subprocess (~20 s)
def test_planner_names_the_new_binding_of_an_old_run_file(tmp_path):
    """A run file of train's former flat settings gets the error `t5x_like.train` gives."""
    run_gin = tmp_path / "old_run.gin"
    run_gin.write_text("train.batch_size = 4\n")
    result, plan = _plan(tmp_path, "--num_devices=2", f"--gin_file={run_gin}")
    assert result.returncode == 2 and plan is None
    assert "error: train.batch_size is now Data.batch_size" in result.stderr, result.stderr


def test_planner_defaults_and_other_model_classes():
    from t5x_like.errors import ConfigError
    from t5x_like.families.bert.model import BertPretrainingModel
    from t5x_like.plan import _parse_args, _with_run_settings, run_defaults

    args = _with_run_settings(_parse_args(["--inputs=64"]), {})
    assert (args.batch_size, args.inputs, args.targets, args.num_microbatches, args.optimizer) == (
        128,
        64,
        114,
        1,
        "adafactor",
    )
    # The trainer builds its groups with the same defaults when nothing is bound: the T5
    # paper's baseline (section 3.1.2: 128 sequences of 512 input and 114 target tokens,
    # AdaFactor) that the planner's flags fall back to.
    from t5x_like.train_settings import Data, Optimizer

    data, optimizer = Data(), Optimizer()
    assert run_defaults() == {
        "batch_size": data.batch_size,
        "inputs": data.task_feature_lengths["inputs"],
        "targets": data.task_feature_lengths["targets"],
        "num_microbatches": optimizer.num_microbatches,
        "optimizer": optimizer.kind,
    }
    with pytest.raises(ConfigError, match="trains BertPretrainingModel"):
        _with_run_settings(_parse_args([]), {"model_class": BertPretrainingModel})
