"""Every command in README.md's ```bash blocks is well-formed, and the cheap ones run.

A README command that names a module, flag, gin file, binding or script that does not exist is
a bug a reader meets first; this file reads the README itself (fenced ```bash blocks,
backslash continuations joined, comment lines and trailing comments dropped, `E=...` assigned
and substituted) so a new or edited command is checked without touching this file.

| README command | checked (default suite) | run for real |
|---|---|---|
| `python -m t5x_like.{train,eval,infer} ...` | module found; `cli.parse_args` accepts the arguments; every `--gin_file` exists; the files and `--gin.X=...` bindings parse with `gin_setup.parse_gin` (an unknown configurable or parameter fails); a macro binding (`--gin.TASK=...`) is used (`%TASK`) by the files | `--help` (`slow`); the Table 2 tiny run, 20 steps, MODEL_DIR moved to a temporary directory (`slow`) |
| `python -m t5x_like.plan ...` | as above for its `--gin_file`s; its argparse parser accepts the arguments | both README plans as written (`slow`); `--help` (`slow`) |
| `python -m t5x_like.{convert,report,data.c4_clean} ...`, `python -m benchmarks.* ...` | module found; every `--gin_file` exists; its argparse parser accepts the README's arguments (the parser is stopped before the program does any work) | `--help` (`slow`) |
| `bash launch/{tpu_vm_*,gpu_run,local_run}.sh --config $E ...` | script and `--config` file exist; `bash -n` | with `--dry-run` (default suite); the trainer command that `local_run` / `gpu_run` print gets the gin checks above, and `local_run`'s `MODEL_DIR` must be local |
| `bash launch/quickstart.sh`, `bash launch/test.sh` | script exists; `bash -n` | no: the quickstart trains for minutes (benchmarks/README.md times it), test.sh is the whole suite |
| `bash benchmarks/gpu_check.sh` | script exists; `bash -n` | no: it needs a GPU |
| `E=FILE`, `source .venv/bin/activate` | `FILE` exists; `source` names the venv's activate script | no |

Explicit skips (`SKIPPED_TOKENS`): the `...` in `python -m t5x_like.train ... --profile_steps=10:15`
stands for a run's own arguments; the rest of that command is still checked.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")

# Tokens that stand for "your arguments here" in the README, with why they are not checked.
SKIPPED_TOKENS = {"...": "placeholder for a run's own gin files and bindings"}
# Entry points whose command line is t5x_like.cli's (gin files + --gin.KEY=VALUE).
CLI_MODULES = {"t5x_like.train", "t5x_like.eval", "t5x_like.infer"}
# Launch scripts without --dry-run, and why they are not run here.
NOT_RUN_SCRIPTS = {
    "launch/quickstart.sh": "trains for minutes (timed in benchmarks/README.md)",
    "launch/test.sh": "the whole test suite",
    "benchmarks/gpu_check.sh": "needs a GPU",
}


@dataclasses.dataclass(frozen=True)
class Command:
    line: int  # README line number where the command starts
    text: str  # as written, continuations joined
    argv: tuple[str, ...]  # shell words, trailing comment dropped, variables substituted

    def __str__(self) -> str:
        return f"README.md:{self.line}: {self.text}"


def _substitute(text: str, variables: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: variables.get(m.group(1), m.group(0)), text)


def readme_commands(path: str = README) -> list[Command]:
    """The commands of every ```bash block, in order."""
    commands: list[Command] = []
    in_block, pending, start = False, "", 0
    variables: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            in_block = line.strip() == "```bash"
            pending, variables = "", {}
            continue
        if not in_block:
            continue
        if not pending:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1].rstrip() + " "
            continue
        text = (pending + line).strip()
        pending = ""
        argv = tuple(shlex.split(_substitute(text, variables), comments=True))
        if len(argv) == 1 and re.fullmatch(r"\w+=\S+", argv[0]):
            name, value = argv[0].split("=", 1)
            variables[name] = value
        commands.append(Command(start, text, argv))
    return commands


COMMANDS = readme_commands()


def _of_kind(kind: str) -> list[Command]:
    return [c for c in COMMANDS if kind_of(c) == kind]


def kind_of(command: Command) -> str:
    argv = command.argv
    if argv[:2] == ("python", "-m") and len(argv) >= 3:
        return "cli" if argv[2] in CLI_MODULES else "module"
    if argv[0] == "bash" and len(argv) >= 2:
        return "script"
    if argv[0] == "source":
        return "source"
    if len(argv) == 1 and re.fullmatch(r"\w+=\S+", argv[0]):
        return "assignment"
    return "unknown"


def _ids(commands: list[Command]) -> list[str]:
    return [f"L{c.line}" for c in commands]


def gin_files_of(args: tuple[str, ...] | list[str]) -> list[str]:
    """`--gin_file=F` and `--gin_file F` arguments."""
    files = []
    for i, arg in enumerate(args):
        if arg.startswith("--gin_file="):
            files.append(arg.split("=", 1)[1])
        elif arg == "--gin_file" and i + 1 < len(args):
            files.append(args[i + 1])
    return files


def gin_text(path: str, seen: set[str] | None = None) -> str:
    """A gin file's text with the files it `include`s (paths relative to the repo root)."""
    seen = set() if seen is None else seen
    full = path if os.path.isabs(path) else os.path.join(ROOT, path)
    if full in seen:
        return ""
    seen.add(full)
    with open(full, encoding="utf-8") as f:
        text = f.read()
    parts = [text]
    for included in re.findall(r"^include\s+['\"]([^'\"]+)['\"]", text, re.M):
        parts.append(gin_text(included, seen))
    return "\n".join(parts)


# ----------------------------------------------------------------------------- extraction
def test_readme_commands_are_extracted():
    """The extractor sees the README's commands (a hand count of a few known ones)."""
    texts = [c.text for c in COMMANDS]
    assert len(COMMANDS) >= 40
    assert "bash launch/quickstart.sh   # pretrain a small T5 on CPU" in texts[0]
    # a continued command is one command, starting on its first line
    plan = [c for c in COMMANDS if c.argv[:3] == ("python", "-m", "t5x_like.plan")]
    assert len(plan) == 2 and "--batch_size=128" in plan[0].argv
    # $E is substituted from its assignment in the same block
    assert any(
        c.argv[:4]
        == ("bash", "launch/tpu_vm_create.sh", "--config", "launch/experiments/t5_base_v4_32.env")
        for c in COMMANDS
    )


def test_every_command_is_a_known_kind():
    unknown = [str(c) for c in COMMANDS if kind_of(c) == "unknown"]
    assert not unknown, "README commands this test does not know how to check:\n" + "\n".join(
        unknown
    )


# ----------------------------------------------------------------------------- static checks
@pytest.mark.parametrize(
    "module", sorted({c.argv[2] for c in COMMANDS if kind_of(c) in ("cli", "module")})
)
def test_module_exists(module):
    assert importlib.util.find_spec(module) is not None, f"no module {module}"


@pytest.mark.parametrize("command", COMMANDS, ids=_ids(COMMANDS))
def test_named_files_exist(command):
    """Gin files, scripts, `--config` files and assigned paths are in the repository."""
    argv = command.argv
    paths = gin_files_of(argv)
    if kind_of(command) == "script":
        paths.append(argv[1])
    if "--config" in argv:
        paths.append(argv[argv.index("--config") + 1])
    if kind_of(command) == "assignment":
        paths.append(argv[0].split("=", 1)[1])
    if kind_of(command) == "source":
        assert argv[1] == ".venv/bin/activate", command
    missing = [p for p in paths if not os.path.exists(os.path.join(ROOT, p))]
    assert not missing, f"{command}\nnames files that do not exist: {missing}"


@pytest.mark.parametrize("command", _of_kind("script"), ids=_ids(_of_kind("script")))
def test_script_is_valid_bash(command):
    done = subprocess.run(["bash", "-n", command.argv[1]], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"{command}\n{done.stderr}"


# ----------------------------------------------------------------------------- gin checks
@pytest.fixture
def clean_gin():
    import gin

    gin.clear_config()
    yield
    gin.clear_config()


def cli_arguments(module: str, args: list[str]) -> list[str]:
    """The arguments as `cli.parse_args` sees them: train's `--profile_steps=A:B` is its
    documented short form of `--gin.train.profile_steps='A:B'` (train.main)."""
    if module != "t5x_like.train":
        return args
    return [
        f"--gin.train.profile_steps='{a.split('=', 1)[1]}'"
        if a.startswith("--profile_steps=")
        else a
        for a in args
    ]


def check_gin(files: list[str], bindings: list[str], where: str) -> None:
    """The files and bindings parse as the trainer parses them; macro bindings are used."""
    import gin

    from t5x_like import gin_setup

    gin.clear_config()
    try:
        gin_setup.parse_gin(files, bindings)
    except (ValueError, SyntaxError) as e:
        pytest.fail(f"{where}\ngin rejects the files/bindings: {e}")
    used = "\n".join(gin_text(f) for f in files)
    for binding in bindings:
        key = binding.split("=", 1)[0].strip()
        if "." not in key and "/" not in key:  # a macro: a typo would bind nothing
            assert re.search(rf"%{re.escape(key)}\b", used), (
                f"{where}\n--gin.{binding}: no gin file of the command uses %{key}"
            )


CLI_COMMANDS = _of_kind("cli")


@pytest.mark.parametrize("command", CLI_COMMANDS, ids=_ids(CLI_COMMANDS))
def test_cli_command_parses(command, clean_gin):
    from t5x_like import cli

    module = command.argv[2]
    args = [a for a in command.argv[3:] if a not in SKIPPED_TOKENS]
    files, bindings = cli.parse_args(cli_arguments(module, args), module)
    # what argparse takes for a gin file (`--gin X=Y` is one: --gin abbreviates --gin_file)
    missing = [f for f in files if not os.path.exists(os.path.join(ROOT, f))]
    assert not missing, f"{command}\ngin files that do not exist: {missing}"
    check_gin(files, bindings, str(command))


PLAN_COMMANDS = [c for c in COMMANDS if c.argv[:3] == ("python", "-m", "t5x_like.plan")]


@pytest.mark.parametrize("command", PLAN_COMMANDS, ids=_ids(PLAN_COMMANDS))
def test_plan_gin_files_parse(command, clean_gin):
    args = command.argv[3:]
    bindings = [args[i + 1] for i, a in enumerate(args) if a == "--gin"]
    check_gin(gin_files_of(args), bindings, str(command))


# ----------------------------------------------------------------------------- argparse modules
# Runs in a subprocess: imports each module and calls its main() with the README's arguments,
# but the first parse_args / parse_known_args returns by raising, so nothing else runs. A
# flag the parser does not know ends that command with argparse's own error (exit 2).
PROBE = r"""
import argparse, contextlib, importlib, io, json, sys

class Parsed(Exception):
    pass

original_parse_args = argparse.ArgumentParser.parse_args
original_parse_known = argparse.ArgumentParser.parse_known_args
inside = []

def parse_args(self, args=None, namespace=None):
    inside.append(1)
    try:
        original_parse_args(self, args, namespace)
    finally:
        inside.pop()
    raise Parsed()

def parse_known_args(self, args=None, namespace=None):
    result = original_parse_known(self, args, namespace)
    if inside:
        return result
    raise Parsed()

argparse.ArgumentParser.parse_args = parse_args
argparse.ArgumentParser.parse_known_args = parse_known_args
results = []
for module, args in json.load(sys.stdin):
    err = io.StringIO()
    sys.argv = [module] + args
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            importlib.import_module(module).main(args)
        results.append("main() returned without parsing its arguments")
    except Parsed:
        results.append("ok")
    except SystemExit as e:
        results.append(f"exit {e.code}: {err.getvalue().strip()}")
    except Exception as e:
        results.append(f"{type(e).__name__}: {e}")
print(json.dumps(results))
"""

MODULE_COMMANDS = _of_kind("module")


def test_module_commands_accept_their_arguments():
    """Every non-cli `python -m X ARGS` of the README: X's own parser accepts ARGS."""
    jobs = [[c.argv[2], list(c.argv[3:])] for c in MODULE_COMMANDS]
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        input=json.dumps(jobs),
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    bad = [f"{c}\n  -> {r}" for c, r in zip(MODULE_COMMANDS, results) if r != "ok"]
    assert not bad, "README commands their module's parser rejects:\n" + "\n".join(bad)


# ----------------------------------------------------------------------------- launch dry runs
DRY_RUN_COMMANDS = [c for c in _of_kind("script") if c.argv[1] not in NOT_RUN_SCRIPTS]


def with_dry_run(args: tuple[str, ...]) -> list[str]:
    """`--dry-run` among the script's own options (before a `--`)."""
    args = list(args)
    at = args.index("--") if "--" in args else len(args)
    return args[:at] + ["--dry-run"] + args[at:]


def printed_train_command(stdout: str) -> list[str] | None:
    for line in stdout.splitlines():
        words = shlex.split(line)
        if "t5x_like.train" in words:
            return words[words.index("t5x_like.train") + 1 :]
    return None


@pytest.mark.parametrize("command", DRY_RUN_COMMANDS, ids=_ids(DRY_RUN_COMMANDS))
def test_launch_command_dry_run(command, clean_gin):
    from t5x_like import cli

    done = subprocess.run(
        ["bash", command.argv[1], *with_dry_run(command.argv[2:])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    assert done.stdout.strip(), f"{command}: --dry-run printed nothing"
    script = os.path.basename(command.argv[1])
    if script not in ("local_run.sh", "gpu_run.sh"):
        return
    args = printed_train_command(done.stdout)
    assert args is not None, f"{command}: no trainer command in\n{done.stdout}"
    files, bindings = cli.parse_args(args, "t5x_like.train")
    check_gin(files, bindings, f"{command}\n(runs: {' '.join(args)})")
    if script == "local_run.sh":  # a CPU run on this machine writes to a local directory
        model_dir = [b.split("=", 1)[1] for b in bindings if b.startswith("MODEL_DIR=")][-1]
        assert "://" not in model_dir, f"{command}\nwrites to {model_dir}; give a local path"


# ----------------------------------------------------------------------------- slow: real runs
def _run_python(args: list[str], timeout: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, env=env, timeout=timeout
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "module", sorted({c.argv[2] for c in COMMANDS if kind_of(c) in ("cli", "module")})
)
def test_module_help_runs(module):
    done = _run_python(["-m", module, "--help"], timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "usage:" in done.stdout


# The README's T5-11B plans (48 unrolled layers) compile for 8-14 minutes on 2 cores
# (benchmarks/README.md, "Memory planner"); beside the rest of the slow set one crossed the
# 900 s timeout and they take most of CI's margin, so they carry `very_slow`, which CI's run
# leaves out (`bash launch/test.sh -m very_slow`). CI still plans T5-11B on 32 devices with
# scanned layers (tests/test_plan.py), and test_plan_gin_files_parse checks these commands' gin.
PLAN_RUNS = [
    pytest.param(c, marks=[pytest.mark.very_slow] if "11B.gin" in c.text else [], id=f"L{c.line}")
    for c in PLAN_COMMANDS
]


@pytest.mark.slow
@pytest.mark.parametrize("command", PLAN_RUNS)
def test_plan_command_runs(command):
    done = _run_python(list(command.argv[1:]), timeout=1800)
    assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert "H100" in done.stdout  # the fit verdicts' table


TABLE2 = [c for c in CLI_COMMANDS if "gin_configs/table2/sizes/tiny.gin" in " ".join(c.argv)]


@pytest.mark.slow
@pytest.mark.parametrize("command", TABLE2, ids=_ids(TABLE2))
def test_table2_tiny_run(command, tmp_path):
    """The README's Table 2 example as written, but into a temporary MODEL_DIR."""
    args = [
        f"--gin.MODEL_DIR={tmp_path}" if a.startswith("--gin.MODEL_DIR=") else a
        for a in command.argv[1:]
    ]
    done = _run_python(args, timeout=900)
    assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert os.path.isdir(tmp_path / "checkpoints")
