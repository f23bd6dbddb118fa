"""Crash-safe checkpoints: an interrupted save is never restored (the run says so and resumes
from the newest complete step); a truncated, missing or damaged file is named with its step."""

from __future__ import annotations

import glob
import json
import os
import shutil

import pytest

from t5x_like import train
from tests.test_train import TINY_RUN


def _run(model_dir, steps, *extra):
    return train.main(
        ["--gin_file=gin_configs/runs/quickstart.gin"]
        + [f"--gin.{b}" for b in TINY_RUN]
        + [
            f"--gin.MODEL_DIR={model_dir}",
            f"--gin.TRAIN_STEPS={steps}",
            "--gin.Evaluation.loss_every=0",
            "--gin.Evaluation.num_predictions=0",
            "--gin.Checkpointing.every=2",
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A run with complete checkpoints at steps 2 and 4 (each with its manifest)."""
    model_dir = tmp_path_factory.mktemp("ckpt") / "run"
    assert _run(model_dir, 4) == 0
    checkpoints = model_dir / "checkpoints"
    assert sorted(os.listdir(checkpoints)) == ["2", "4"]
    for step in ("2", "4"):
        manifest = json.loads((checkpoints / step / "t5x_like_manifest.json").read_text())
        assert manifest["step"] == int(step) and any("params" in f for f in manifest["files"])
    return model_dir


def _copy(run, tmp_path):
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


@pytest.mark.slow  # a training run as its fixture (the default suite must stay under 15 minutes)
def test_an_interrupted_save_is_ignored_reported_and_removed(finished_run, tmp_path, capsys):
    model_dir = _copy(finished_run, tmp_path)
    checkpoints = model_dir / "checkpoints"
    # What a kill during orbax's save leaves: the step's files under a temporary name, never
    # renamed to "4". The newest complete checkpoint is then step 2.
    os.rename(checkpoints / "4", checkpoints / "4.orbax-checkpoint-tmp-1796097000")
    assert _run(model_dir, 5) == 0
    out = capsys.readouterr().out
    assert (
        "Ignoring 4.orbax-checkpoint-tmp-1796097000" in out
        and "interrupted before it completed" in out
        and "Resuming from step 2, the newest complete checkpoint." in out
    )
    assert "Resumed from the checkpoint at step 2" in out
    left = os.listdir(checkpoints)
    assert "5" in left and not any("tmp" in name for name in left), left


def _flip_bytes(path, count=8):
    """Same size, other bytes: what a bad disk or a stray write leaves."""
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        for i in range(len(data) // 2, len(data) // 2 + count):
            data[i] ^= 0xFF
        f.seek(0)
        f.write(data)


@pytest.mark.parametrize(
    "damage",
    [
        "truncated",
        "missing",
        "garbled config",
        "flipped params",
        "flipped opt_state",
        "garbage manifest",
    ],
)
def test_a_damaged_checkpoint_is_an_error_naming_the_step_and_the_file(
    damage, finished_run, tmp_path, capsys
):
    model_dir = _copy(finished_run, tmp_path)
    step_dir = model_dir / "checkpoints" / "4"
    config_gin = (model_dir / "config.gin").read_text()
    if damage == "truncated":
        victim = max(glob.glob(f"{step_dir}/params/**/d/*", recursive=True), key=os.path.getsize)
        with open(victim, "r+b") as f:
            f.truncate(os.path.getsize(victim) // 2)
        why = "bytes where"
    elif damage == "missing":
        victim = glob.glob(f"{step_dir}/opt_state/**/d/*", recursive=True)[0]
        os.remove(victim)
        why = "the file is missing"
    elif damage == "garbage manifest":
        victim = f"{step_dir}/t5x_like_manifest.json"
        with open(victim, "w") as f:
            f.write("not json {")
        why = "the manifest is not readable"
    else:  # same size, other bytes: only the checksum can tell
        item = {
            "garbled config": "config",
            "flipped params": "params",
            "flipped opt_state": "opt_state",
        }[damage]
        victim = max(
            (p for p in glob.glob(f"{step_dir}/{item}/**/*", recursive=True) if os.path.isfile(p)),
            key=os.path.getsize,
        )
        _flip_bytes(victim)
        why = "CRC-32 mismatch"
    assert _run(model_dir, 6) == 2
    err = capsys.readouterr().err
    assert f"The checkpoint of step 4 is damaged: {victim}: " in err and why in err
    assert f"Move {step_dir} aside and rerun to resume from step 2" in err
    # Refused before anything was written: no step trained, pruned or saved, config kept.
    assert sorted(os.listdir(model_dir / "checkpoints")) == ["2", "4"]
    assert (model_dir / "config.gin").read_text() == config_gin


def test_every_committed_step_carries_its_manifest_with_checksums(finished_run):
    """The manifest is written into the step before orbax commits it; it lists every file
    with its size and CRC-32 (zlib's, recomputed here), orbax's commit-time bookkeeping
    aside."""
    import zlib

    step_dir = finished_run / "checkpoints" / "4"
    files = json.loads((step_dir / "t5x_like_manifest.json").read_text())["files"]
    on_disk = {
        os.path.relpath(p, step_dir)
        for p in glob.glob(f"{step_dir}/**/*", recursive=True)
        if os.path.isfile(p)
        and os.path.basename(p) not in ("_CHECKPOINT_METADATA", "commit_success.txt")
    }
    assert set(files) == on_disk - {"t5x_like_manifest.json"}
    for name, entry in files.items():
        data = (step_dir / name).read_bytes()
        assert entry == {"size": len(data), "crc32": zlib.crc32(data)}


@pytest.mark.slow  # a training run
def test_a_step_without_manifest_is_not_trusted_and_the_run_resumes_before_it(
    finished_run, tmp_path, capsys
):
    """What older versions left when killed between a commit and its manifest."""
    model_dir = _copy(finished_run, tmp_path)
    os.remove(model_dir / "checkpoints" / "4" / "t5x_like_manifest.json")
    assert _run(model_dir, 5) == 0
    out = capsys.readouterr().out
    assert "Ignoring step 4" in out and "it has no manifest" in out
    assert "Resumed from the checkpoint at step 2" in out


@pytest.mark.slow  # a training run
def test_pruning_keeps_the_newest_verified_steps(tmp_path):
    model_dir = tmp_path / "run"
    assert _run(model_dir, 8, "--gin.Checkpointing.keep=2") == 0
    assert sorted(os.listdir(model_dir / "checkpoints"), key=int) == ["6", "8"]


@pytest.mark.slow  # two training subprocesses (~80 s)
def test_kill_9_in_the_middle_of_a_save_then_rerun_resumes_from_a_complete_step(tmp_path):
    """A real kill -9 while orbax is writing a step: the rerun ignores the half-written step
    and resumes from the newest complete one."""
    import signal
    import subprocess
    import sys
    import time

    from tests.test_train import ROOT

    model_dir = tmp_path / "run"
    checkpoints = model_dir / "checkpoints"

    def command(steps):
        return [
            sys.executable,
            "-m",
            "t5x_like.train",
            "--gin_file=gin_configs/runs/quickstart.gin",
        ] + [
            f"--gin.{b}"
            for b in TINY_RUN
            + [
                f"MODEL_DIR={model_dir}",
                f"TRAIN_STEPS={steps}",
                "Evaluation.loss_every=0",
                "Evaluation.num_predictions=0",
                "Checkpointing.every=1",
                "Checkpointing.keep=3",
            ]
        ]

    proc = subprocess.Popen(
        command(100_000), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    caught = None
    try:
        deadline = time.time() + 300
        while caught is None and time.time() < deadline and proc.poll() is None:
            names = os.listdir(checkpoints) if checkpoints.exists() else []
            complete = [n for n in names if n.isdigit()]
            caught = next((n for n in names if "tmp" in n), None) if complete else None
            if caught is None:
                time.sleep(0.002)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert caught, "never saw a save in progress"
    left = os.listdir(checkpoints)
    half_written = [n for n in left if "tmp" in n]
    assert half_written, f"the save finished before the kill landed ({left}); rerun the test"
    newest = max(int(n) for n in left if n.isdigit())
    assert (checkpoints / str(newest) / "t5x_like_manifest.json").exists()
    rerun = subprocess.run(
        command(newest + 1), cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"Ignoring {half_written[0]}" in rerun.stdout
    assert f"Resumed from the checkpoint at step {newest}" in rerun.stdout
    assert not any("tmp" in n for n in os.listdir(checkpoints))
