"""A real short run, profiled: `--profile_steps` leaves a jax.profiler trace where
TensorBoard's Profile tab looks, and `python -m t5x_like.report` reads the run's event files
into a summary table (equal to what the run logged) and three PNG plots."""

import os

import pytest

from t5x_like import logs, report, train
from tests.test_train import ROOT, TINY_RUN


@pytest.mark.slow  # a training run (the default suite must stay under 15 minutes)
def test_profiled_run_then_report(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    model_dir = tmp_path / "run"
    assert (
        train.main(
            [
                "--gin_file=gin_configs/runs/quickstart.gin",
                "--profile_steps=2:4",
                *[f"--gin.{b}" for b in TINY_RUN],
                f"--gin.MODEL_DIR={model_dir}",
                "--gin.TRAIN_STEPS=10",
                "--gin.Evaluation.loss_every=5",
                "--gin.Evaluation.num_predictions=0",
            ]
        )
        == 0
    )
    logged = capsys.readouterr().out
    traces = [
        f
        for _, _, files in os.walk(model_dir / "tensorboard" / "plugins" / "profile")
        for f in files
        if f.endswith(".xplane.pb")
    ]
    assert traces and "profile of steps 2-4 written" in logged
    final = [line for line in logs.unstamped(logged) if line.startswith("step      10  loss")][0]
    assert "step_s " in final and "mfu " in final

    assert report.main([str(model_dir)]) == 0
    table = capsys.readouterr().out
    assert f"final train loss      {final.split(' loss ')[1].split()[0]}" in table
    assert "last step             10" in table and "best eval loss" in table
    assert "MFU (median)" in table and "tokens/s (median)" in table
    for name in ("loss.png", "learning_rate.png", "throughput.png"):
        data = (model_dir / "report" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000


def test_report_on_a_directory_without_summaries_is_a_clear_error(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert "no tensorboard/ directory" in capsys.readouterr().err
