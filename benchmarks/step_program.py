"""Is the compiled train step the same program at two commits?

    python -m benchmarks.step_program --base <commit> [--family t5] [--batch 8]
        [--inputs 512] [--targets 128] [--gin KEY=VALUE]

A refactoring that moves code but keeps behaviour must leave the program XLA runs unchanged.
This compiles the family's standard benchmark step (`step_regression.build_standard_step`: the
trainer's sharded step on one device, the recipe's optimizer, the batch `train_throughput`
times) once in a worker inside each tree (`--base` extracted with `git archive`, and this
checkout), takes the optimized HLO text, removes what names where code lives rather than what
it computes (`metadata={...}` and the tables of source locations: op names, source files and
lines; the module's name), and
compares the two. It prints whether they are equal (with a unified diff of the first
differences when not), writes JSON, and exits 1 when they differ. Same program means same step
time on any machine; `benchmarks.step_regression` measures the time when they differ.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import hashlib
import importlib.util
import itertools
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_METADATA = re.compile(r",?\s*metadata=\{[^{}]*\}")
_MODULE_LINE = re.compile(r"^HloModule \S+")


@functools.cache
def _step_regression():
    """This checkout's `step_regression`, loaded by path: a worker runs with the base tree
    first on sys.path, and an old base may lack `build_standard_step`."""
    spec = importlib.util.spec_from_file_location(
        "_head_step_regression",
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "step_regression.py"),
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Tables of source locations that newer XLA prints after the module line, each a header line
# followed by entries up to a blank line; instructions point into them by `stack_frame_id`.
_LOCATION_TABLES = frozenset({"FileNames", "FunctionNames", "FileLocations", "StackFrames"})


def canonical_hlo(text: str) -> str:
    """Optimized HLO text without the parts that record where code lives: each instruction's
    `metadata={op_name=... source_file=... source_line=... stack_frame_id=...}`, the tables of
    source locations and the module's name."""
    lines, in_table = [], False
    for line in text.splitlines():
        if line.strip() in _LOCATION_TABLES:
            in_table = True
            continue
        if in_table:
            in_table = bool(line.strip())
            continue
        line = _MODULE_LINE.sub("HloModule step", _METADATA.sub("", line)).rstrip()
        if line:
            lines.append(line)
    return "\n".join(lines) + "\n"


def compare_programs(base: str, head: str, context_lines: int = 40) -> dict[str, Any]:
    """Whether two canonical HLO texts are equal, their digests, and the first lines of their
    unified diff when not."""
    same = base == head
    diff = (
        []
        if same
        else list(
            itertools.islice(
                difflib.unified_diff(
                    base.splitlines(), head.splitlines(), "base", "head", lineterm=""
                ),
                context_lines,
            )
        )
    )
    return {
        "same_program": same,
        "base_sha256": hashlib.sha256(base.encode()).hexdigest(),
        "head_sha256": hashlib.sha256(head.encode()).hexdigest(),
        "base_lines": base.count("\n"),
        "head_lines": head.count("\n"),
        "diff_head": diff,
    }


def _worker(args: argparse.Namespace) -> None:
    """Runs inside a tree: compile its standard step and print the canonical HLO."""
    compiled, *_ = _step_regression().build_standard_step(
        args.family, args.batch, args.inputs, args.targets, args.bindings
    )
    sys.stdout.write(canonical_hlo(compiled.as_text()))


def program_of(tree: str, args: argparse.Namespace) -> str:
    """The canonical HLO of `tree`'s standard step, compiled in a fresh process."""
    command, env = _step_regression().worker_command(__file__, tree, args)
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"Compiling the step in {tree} failed:\n{done.stderr[-4000:]}")
    return done.stdout


def compare(args: argparse.Namespace) -> dict[str, Any]:
    regression = _step_regression()
    with tempfile.TemporaryDirectory() as tmp:
        base_commit = regression.extract(args.base, tmp)
        base = program_of(tmp, args)
    head = program_of(ROOT, args)
    return {
        "base": args.base,
        "base_commit": base_commit,
        "head_commit": regression.head_commit(),
        "family": args.family,
        "batch": args.batch,
        "inputs": args.inputs,
        "targets": args.targets,
        "bindings": args.bindings,
        **compare_programs(base, head),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD~1", help="git revision to compare against")
    _step_regression().add_step_arguments(parser)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="benchmarks/results/step_program.json")
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args)
        return 0
    result = compare(args)
    print(f"{'':<6} {'commit':<22} {'HLO lines':>10}  sha256")
    print(
        f"{'base':<6} {result['base_commit'][:12]:<22} {result['base_lines']:>10}  "
        f"{result['base_sha256'][:16]}"
    )
    print(
        f"{'head':<6} {result['head_commit'][:22]:<22} {result['head_lines']:>10}  "
        f"{result['head_sha256'][:16]}"
    )
    if result["same_program"]:
        print(f"SAME PROGRAM: the {args.family} step compiles to identical optimized HLO.")
    else:
        print("DIFFERENT PROGRAM; first differences:\n" + "\n".join(result["diff_head"]))
    from benchmarks import results_io  # here: a worker runs this file inside the base tree

    results_io.write_json(args.out, result)
    return 0 if result["same_program"] else 1


if __name__ == "__main__":
    sys.exit(main())
