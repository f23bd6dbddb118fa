"""Every console command that pyproject.toml's `[project.scripts]` declares is installed (the
entry point pip wrote names the same function) and runs: `--help` prints its usage and exits 0,
as `python -m t5x_like.<module> --help` does."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
import tomllib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    SCRIPTS: dict[str, str] = tomllib.load(f)["project"]["scripts"]


def test_every_entry_point_module_has_a_command():
    modules = {target.split(":")[0] for target in SCRIPTS.values()}
    assert {
        "t5x_like.train",
        "t5x_like.eval",
        "t5x_like.infer",
        "t5x_like.convert",
        "t5x_like.plan",
        "t5x_like.report",
    } <= modules


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_command_is_installed_and_answers_help(name, capsys, monkeypatch):
    installed = {e.name: e.value for e in importlib.metadata.entry_points(group="console_scripts")}
    assert installed.get(name) == SCRIPTS[name], "reinstall: pip install -e ."
    module, function = SCRIPTS[name].split(":")
    command = getattr(importlib.import_module(module), function)
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    with pytest.raises(SystemExit) as exited:
        command()
    assert exited.value.code == 0
    assert "usage:" in capsys.readouterr().out
