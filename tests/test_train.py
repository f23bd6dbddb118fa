"""The training loop: schedule, a short run whose loss falls, kill -9 and resume, bad input."""

import json
import os
import signal
import subprocess
import sys
import time

import gin
import numpy as np
import pytest

from t5x_like import gin_setup, logs, optimizers, train
from tests.fake_metadata_server import FakeMetadataServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_RUN = [
    "T5Config.vocab_size=2048",
    "T5Config.emb_dim=64",
    "T5Config.num_heads=2",
    "T5Config.head_dim=32",
    "T5Config.mlp_dim=128",
    "T5Config.num_encoder_layers=1",
    "T5Config.num_decoder_layers=1",
    "T5Config.mlp_activations=('gelu', 'linear')",
    "T5Config.logits_via_embedding=False",
    "T5Config.dropout_rate=0.0",
    "Data.task_feature_lengths={'inputs': 64, 'targets': 16}",
    "Data.batch_size=8",
    "Evaluation.loss_batches=1",
    "Evaluation.num_predictions=2",
    "train.log_every=5",
]


def test_inverse_sqrt_schedule_values():
    schedule = optimizers.inverse_sqrt_schedule(10_000)
    np.testing.assert_allclose(float(schedule(1)), 0.01, rtol=1e-6)
    np.testing.assert_allclose(float(schedule(10_000)), 0.01, rtol=1e-6)
    np.testing.assert_allclose(float(schedule(40_000)), 0.005, rtol=1e-6)


def test_short_run_loss_falls_and_saves(tmp_path, capsys):
    model_dir = tmp_path / "run"
    gin_setup.parse_gin(
        [os.path.join(ROOT, "gin_configs/runs/quickstart.gin")],
        TINY_RUN
        + [
            f"MODEL_DIR={model_dir}",
            "TRAIN_STEPS=40",
            "Evaluation.loss_every=40",
            "Checkpointing.every=20",
        ],
    )
    train.train()
    out = capsys.readouterr().out
    losses = [
        float(line.split("loss ")[1].split()[0])
        for line in logs.unstamped(out)
        if line.startswith("step") and " loss " in line and "eval" not in line
    ]
    assert len(losses) == 8
    assert losses[-1] < losses[0] - 1.0, losses
    assert "eval loss" in out and "predicted:" in out and "true:" in out
    assert sorted(os.listdir(model_dir / "checkpoints")) == ["20", "40"]
    assert "T5Config.emb_dim = 64" in (model_dir / "config.gin").read_text()
    assert os.listdir(model_dir / "tensorboard")


def _train_cmd(model_dir, steps, every=5):
    bindings = TINY_RUN + [
        f"MODEL_DIR={model_dir}",
        f"TRAIN_STEPS={steps}",
        "Evaluation.loss_every=0",
        "Evaluation.num_predictions=0",
        f"Checkpointing.every={every}",
    ]
    return [
        sys.executable,
        "-m",
        "t5x_like.train",
        "--gin_file=gin_configs/runs/quickstart.gin",
    ] + [f"--gin.{b}" for b in bindings]


@pytest.mark.slow  # two training subprocesses (~150 s); CI runs the slow set
def test_killed_run_resumes_from_newest_checkpoint(tmp_path):
    model_dir = tmp_path / "run"
    ckpts = model_dir / "checkpoints"
    proc = subprocess.Popen(
        _train_cmd(model_dir, 100_000),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            done = [int(d) for d in os.listdir(ckpts) if d.isdigit()] if ckpts.exists() else []
            if done and max(done) >= 10:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the run wrote no checkpoint at step >= 10 within 240 s")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    saved = max(int(d) for d in os.listdir(ckpts) if d.isdigit())
    resumed = subprocess.run(
        _train_cmd(model_dir, saved + 5), cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Resumed from the checkpoint at step {saved}" in resumed.stdout
    assert f"step {saved + 5:>7}  loss" in resumed.stdout
    assert f"step {saved + 1:>7}" not in resumed.stdout.split("Resumed")[0]
    assert max(int(d) for d in os.listdir(ckpts) if d.isdigit()) == saved + 5


@pytest.mark.slow  # a training run, then two refused resumes (default suite under 15 minutes)
def test_resume_with_another_model_is_refused(tmp_path, capsys):
    """(The first run trains with scanned layers, sharded over the simulated devices.)"""
    model_dir = tmp_path / "run"
    gin_setup.parse_gin(
        ["gin_configs/runs/quickstart.gin"],
        TINY_RUN
        + [
            f"MODEL_DIR={model_dir}",
            "TRAIN_STEPS=2",
            "Evaluation.loss_every=0",
            "Evaluation.num_predictions=0",
            "T5Config.scan_layers=True",
        ],
    )
    train.train()
    gin.clear_config()
    code = train.main(
        ["--gin_file=gin_configs/runs/quickstart.gin"]
        + [f"--gin.{b}" for b in TINY_RUN]
        + [
            f"--gin.MODEL_DIR={model_dir}",
            "--gin.T5Config.emb_dim=96",
            "--gin.TRAIN_STEPS=4",
            "--gin.T5Config.scan_layers=True",
        ]
    )
    assert code == 2
    assert "emb_dim: checkpoint 64 vs config 96" in capsys.readouterr().err
    gin.clear_config()
    code = train.main(
        ["--gin_file=gin_configs/runs/quickstart.gin"]
        + [f"--gin.{b}" for b in TINY_RUN]
        + [f"--gin.MODEL_DIR={model_dir}", "--gin.TRAIN_STEPS=4"]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "trained with scan_layers=True" in err and "T5Config.scan_layers=True" in err


@pytest.mark.slow  # two training subprocesses
@pytest.mark.parametrize("notice", ["SIGTERM", "maintenance event"])
def test_preemption_notice_saves_at_the_current_step_exits_zero_and_resumes(notice, tmp_path):
    """A preemption notice mid-run (SIGTERM, or the Cloud VM metadata server announcing host
    maintenance): the run saves a checkpoint at the step it was on (not a Checkpointing.every
    multiple), exits 0, and the same command resumes there."""
    model_dir = tmp_path / "run"
    ckpts = model_dir / "checkpoints"
    server = FakeMetadataServer()
    proc = subprocess.Popen(
        _train_cmd(model_dir, 100_000, every=100_000)
        + [
            "--gin.train.log_every=1",
            "--gin.PreemptionWatcher.poll_seconds=0.1",
            f"--gin.PreemptionWatcher.maintenance_event_url='{server.url}'",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    lines = []
    try:
        for line in proc.stdout:
            line = logs.STAMP.sub("", line)
            lines.append(line)
            if line.startswith("step") and " loss " in line and int(line.split()[1]) >= 7:
                if notice == "SIGTERM":
                    proc.send_signal(signal.SIGTERM)
                else:
                    server.announce("TERMINATE_ON_HOST_MAINTENANCE")
                break
        out, _ = proc.communicate(timeout=240)
    finally:
        proc.kill()
        server.close()
    lines += logs.unstamped(out)
    assert proc.returncode == 0
    stopped = [line for line in lines if f"stopped by {notice}" in line]
    assert len(stopped) == 1, lines[-5:]
    step = int(stopped[0].split()[1])
    assert step >= 7
    assert [int(d) for d in os.listdir(ckpts) if d.isdigit()] == [step]
    resumed = subprocess.run(
        _train_cmd(model_dir, step + 3, every=100_000),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Resumed from the checkpoint at step {step}" in resumed.stdout
    assert max(int(d) for d in os.listdir(ckpts) if d.isdigit()) == step + 3


def test_the_run_looks_its_task_up_once(tmp_path, monkeypatch):
    """`train` resolves its task once and hands the object to the data checks, the training
    stream, the evaluation batches and the printed predictions: seqio's registry is asked for
    the task's name exactly once (eight times before the object was handed on)."""
    import seqio
    from seqio import dataset_providers

    task = "offline_span_corruption"
    lookups = []
    original = dataset_providers.get_mixture_or_task

    def counting(name):
        lookups.append(name)
        return original(name)

    monkeypatch.setattr(dataset_providers, "get_mixture_or_task", counting)
    monkeypatch.setattr(seqio, "get_mixture_or_task", counting)
    gin_setup.parse_gin(
        ["gin_configs/runs/quickstart.gin"],
        TINY_RUN
        + [
            f"MODEL_DIR={tmp_path / 'run'}",
            f"TASK='{task}'",
            "TRAIN_STEPS=2",
            "Evaluation.loss_every=2",
            "Checkpointing.every=100",
        ],
    )
    try:
        train.train()
    finally:
        gin.clear_config()
    assert lookups.count(task) == 1, lookups


def test_task_metrics_during_training_score_and_keep_the_best(tmp_path):
    """`Evaluation.metrics_every` decodes the task's validation examples during training,
    scores them with the task's metric and keeps the best parameters: the path a fine-tuning
    run takes, in the default suite (the slow fine-tuning tests train it for real). The
    accuracy is the task's own metric over 4 examples, so it is a multiple of 25."""
    model_dir = tmp_path / "run"
    gin_setup.parse_gin(
        ["gin_configs/runs/quickstart.gin"],
        TINY_RUN
        + [
            f"MODEL_DIR={model_dir}",
            "TASK='offline_first_word'",
            "TRAIN_STEPS=2",
            "Evaluation.loss_every=0",
            "Evaluation.num_predictions=0",
            "Evaluation.metrics_every=2",
            "Evaluation.metrics_examples=4",
            "Evaluation.metrics_batch_size=4",
            "Checkpointing.every=100",
        ],
    )
    try:
        train.train()
    finally:
        gin.clear_config()
    best = json.loads((model_dir / "best" / "best.json").read_text())["offline_first_word"]
    assert best["metric"] == "accuracy" and best["step"] == 2
    assert best["value"] in (0.0, 25.0, 50.0, 75.0, 100.0)
    assert (model_dir / "best" / "offline_first_word").is_dir()
