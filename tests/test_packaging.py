"""What `pip install .` puts into site-packages: the library, this repository's tasks as
`t5x_like.tasks` and the gin files as `t5x_like/gin_configs`, and nothing under a generic
top-level name (`tasks`, `benchmarks`), so a non-editable install runs the README's
`--gin_file=gin_configs/...` commands from any directory.

The truth here is the tree itself (every package directory and gin file in the checkout) and
setuptools' own wheel build of pyproject.toml."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tomllib
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tree_packages() -> set[str]:
    """Every directory of the library holding an __init__.py, as a package name."""
    found = set()
    for directory, _, files in os.walk(os.path.join(ROOT, "t5x_like")):
        if "__init__.py" in files:
            found.add(os.path.relpath(directory, ROOT).replace(os.sep, "."))
    return found


def test_the_package_list_names_every_package_of_the_tree():
    """pyproject.toml lists the packages by hand (tasks/ and gin_configs/ are mapped under
    t5x_like): a new subpackage must be added there, or a wheel would miss it."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        setuptools_config = tomllib.load(f)["tool"]["setuptools"]
    listed = set(setuptools_config["packages"])
    assert listed == _tree_packages() | {"t5x_like.tasks", "t5x_like.gin_configs"}
    assert setuptools_config["package-dir"] == {
        "t5x_like.tasks": "tasks",
        "t5x_like.gin_configs": "gin_configs",
    }


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["--no-index", "-w", str(out), ROOT],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (path,) = glob.glob(str(out / "*.whl"))
    return path


def test_the_wheel_ships_tasks_and_gin_files_under_the_project_name(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {n.split("/")[0] for n in names}
    assert top_level == {"t5x_like", "t5x_like-0.1.0.dist-info"}
    for path in glob.glob(os.path.join(ROOT, "tasks", "*.py")):
        assert f"t5x_like/tasks/{os.path.basename(path)}" in names
    gin_files = glob.glob(os.path.join(ROOT, "gin_configs", "**", "*.gin"), recursive=True)
    assert gin_files
    for path in gin_files:
        assert "t5x_like/" + os.path.relpath(path, ROOT).replace(os.sep, "/") in names
    modules = {
        os.path.relpath(p, ROOT).replace(os.sep, "/")
        for p in glob.glob(os.path.join(ROOT, "t5x_like", "**", "*.py"), recursive=True)
    }
    assert modules <= set(names)


@pytest.mark.slow  # installs the wheel and imports TensorFlow in a fresh process (~30 s)
def test_an_installed_wheel_runs_the_gin_files_from_anywhere(wheel, tmp_path):
    """Installed (not editable) into a directory of its own and run from an empty working
    directory: the tasks register as `t5x_like.tasks`, the shipped gin files (with their
    `include`s) parse by the names the README uses, and no top-level `tasks` exists."""
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q"]
        + ["--target", str(target), wheel],
        check=True,
        capture_output=True,
        timeout=600,
    )
    script = (
        "import importlib.util, seqio\n"
        "from t5x_like import gin_setup\n"
        "gin_setup.parse_gin(['gin_configs/table2/encoder_decoder_denoising.gin'])\n"
        "import t5x_like, t5x_like.tasks\n"
        "print(t5x_like.__file__)\n"
        "print(t5x_like.tasks.__file__)\n"
        "print(gin_setup.find_gin_file('gin_configs/runs/quickstart.gin'))\n"
        "print(seqio.get_mixture_or_task('offline_span_corruption').name)\n"
        "print(importlib.util.find_spec('tasks'), importlib.util.find_spec('benchmarks'))\n"
    )
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target)}
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    package, tasks, quickstart, task, missing = result.stdout.strip().splitlines()[-5:]
    assert package == str(target / "t5x_like" / "__init__.py")
    assert tasks == str(target / "t5x_like" / "tasks" / "__init__.py")
    assert quickstart == str(target / "t5x_like" / "gin_configs" / "runs" / "quickstart.gin")
    assert task == "offline_span_corruption"
    assert missing == "None None"
    # The train command finds the shipped file by the README's name and parses it: here up to
    # an old binding it refuses (nothing is trained), after the file itself was read.
    command = subprocess.run(
        [sys.executable, "-m", "t5x_like.train", "--gin_file=gin_configs/runs/quickstart.gin"]
        + ["--gin.train.batch_size=4", f"--gin.MODEL_DIR={tmp_path / 'run'}"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert command.returncode == 2, command.stderr[-3000:]
    assert "error: train.batch_size is now Data.batch_size" in command.stderr
