"""Train-step regression check between two commits, interleaved so machine drift cancels.

    python -m benchmarks.step_regression --base HEAD~1 [--rounds 10] [--tolerance 0.03]
        [--family bert] [--gin BertConfig.dropout_rate=0.1]

A shared CPU VM drifts by ±7 % and more between runs minutes apart, so two benchmark runs one
after the other cannot show a 3 % regression. This check extracts `--base` (any git revision)
into a temporary directory and starts one worker process per tree (the base and this
checkout). Each worker compiles the standard benchmark step (`benchmarks.families`: T5, or
`--family`, with its recipe's optimizer; batch 8 x 512 + 128, the trainer's own sharded step on
one device; `--gin` bindings over the config, e.g. to switch dropout on) once, then waits;
the parent asks them for one step at a time, alternating A B B A, so both see the same machine.
It prints the median step of each, the per-round ratio head/base (median and interquartile
range) and a verdict, writes JSON, and exits 1 on a regression: the head slower in at least
three rounds of four (the ratios' 25th percentile above 1) by more than `--tolerance` at the
median.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.cache
def _interleave():
    """`benchmarks/interleave.py` of this checkout, loaded by path: a worker runs with the base
    tree first on sys.path, and an old base has no such module."""
    spec = importlib.util.spec_from_file_location(
        "_head_interleave",
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "interleave.py"),
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_standard_step(
    family_name: str, batch: int, inputs: int, targets: int, bindings: list[str]
) -> tuple[Any, Any, Any, Any]:
    """(compiled step, state, batch, rng) of the family's standard benchmark step, built with
    the code of the tree on sys.path (this function only calls the trainer's public API, so an
    older tree builds its own step). `step_program` compiles the same step to compare its
    program between commits."""
    import jax

    importlib.import_module("t5x_like")  # its host settings first, as every entry point
    from benchmarks.families import FAMILIES
    from t5x_like import optimizers, partitioning, trainer

    family = FAMILIES[family_name]
    cfg = family.benchmark_config
    if bindings:
        try:
            from t5x_like.gin_setup import bind_over
        except ImportError:  # a base from before gin_setup held it
            from t5x_like.config import bind_over  # type: ignore[attr-defined,no-redef]

        cfg = bind_over(cfg, bindings)
    model = family.make_model(cfg, None)
    if hasattr(family, "make_optimizer"):
        lr, optimizer = family.make_optimizer()
    elif family_name == "t5":  # a base from before families named their optimizer
        lr = optimizers.inverse_sqrt_schedule()
        optimizer = optimizers.t5_adafactor(lr)
    else:
        raise SystemExit(
            f"This tree's benchmarks/families.py predates per-family optimizers: "
            f"--family {family_name} needs a newer --base."
        )
    mesh = partitioning.make_mesh(mesh_shape=(1, 1), devices=jax.devices()[:1])
    rules = partitioning.logical_axis_rules("auto", num_partitions=1)
    layout = trainer.make_layout(model, optimizer, mesh, rules)
    state = trainer.init_state(model, optimizer, jax.random.key(0), layout)
    data = partitioning.global_batch(family.make_batch(cfg, batch, inputs, targets), mesh, rules)
    step = trainer.make_train_step(model, optimizer, lr, layout)
    rng = jax.random.key(1)
    with layout.context():
        compiled = step.lower(state, data, rng).compile()
    return compiled, state, data, rng


def _worker(family_name: str, batch: int, inputs: int, targets: int, bindings: list[str]) -> None:
    """Runs inside a tree (its code on sys.path): compile the step, then serve one step per
    request (`interleave.serve`)."""
    compiled, state, data, rng = build_standard_step(family_name, batch, inputs, targets, bindings)
    holder = {"state": state}

    def one_step() -> None:
        holder["state"], metrics = compiled(holder["state"], data, rng)
        metrics["loss"].block_until_ready()

    one_step()  # warm-up
    interleave = _interleave()
    interleave.serve(interleave.timed(one_step))


def worker_command(script: str, tree: str, args: argparse.Namespace) -> tuple[list[str], dict]:
    """(command, environment) that runs `script --worker` with the step arguments
    (`add_step_arguments`) on `tree`'s code: the tree first on the path, the XLA flags kept."""
    env = {**os.environ, "PYTHONPATH": tree, "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")}
    command = [
        sys.executable,
        os.path.abspath(script),
        "--worker",
        "--family",
        args.family,
        "--batch",
        str(args.batch),
        "--inputs",
        str(args.inputs),
        "--targets",
        str(args.targets),
        *[f"--gin={b}" for b in args.bindings],
    ]
    return command, env


def _start_worker(tree: str, args: argparse.Namespace, name: str):
    command, env = worker_command(__file__, tree, args)
    return _interleave().StepServer(command, cwd=tree, env=env, name=f"{name} worker ({tree})")


def extract(revision: str, into: str) -> str:
    """`git archive` of `revision` unpacked into `into`; returns its commit hash."""
    commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{revision}^{{commit}}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if commit.returncode:
        raise SystemExit(f"--base {revision!r} is not a commit here: {commit.stderr.strip()}")
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit.stdout.strip()],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", into], input=archive.stdout, check=True)
    return commit.stdout.strip()


def verdict(ratios: list[float], tolerance: float) -> dict[str, Any]:
    result = _interleave().quartiles(ratios)
    result["regression"] = result["ratio_q1"] > 1.0 and result["ratio_median"] > 1.0 + tolerance
    return result


def head_commit() -> str:
    """This checkout's commit, with "+uncommitted" when tracked files differ from it: what the
    "head" side of a comparison ran."""
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = bool(
        subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    return commit + ("+uncommitted" if dirty else "")


def compare(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        base_commit = extract(args.base, tmp)
        head = head_commit()
        base = _start_worker(tmp, args, "base")
        head_worker = _start_worker(ROOT, args, "head")
        try:
            base_times, head_times, ratios = _interleave().alternate(
                base.step, head_worker.step, args.rounds
            )  # ratio: head over base
        finally:
            base.close()
            head_worker.close()
    return {
        "base": args.base,
        "base_commit": base_commit,
        "head_commit": head,
        "rounds": args.rounds,
        "tolerance": args.tolerance,
        "bindings": args.bindings,
        "base_step_s_median": statistics.median(base_times),
        "head_step_s_median": statistics.median(head_times),
        "base_steps_s": base_times,
        "head_steps_s": head_times,
        "ratios": ratios,
        **verdict(ratios, args.tolerance),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def add_step_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments that choose the standard step (`build_standard_step`), shared with
    `step_program`."""
    parser.add_argument(
        "--family",
        default="t5",
        choices=["t5", "decoder_only", "bert"],
        help="whose standard benchmark step (benchmarks.families)",
    )
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--inputs", type=int, default=512)
    parser.add_argument("--targets", type=int, default=128)
    parser.add_argument(
        "--gin",
        action="append",
        default=[],
        dest="bindings",
        help="gin binding over the family's benchmark config, in both trees "
        "(e.g. --gin BertConfig.dropout_rate=0.1)",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD~1", help="git revision to compare against")
    parser.add_argument("--rounds", type=int, default=10, help="A B B A rounds (>= 4)")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=0.03,
        help="slow-down below which no regression is reported",
    )
    add_step_arguments(parser)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="benchmarks/results/step_regression.json")
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args.family, args.batch, args.inputs, args.targets, args.bindings)
        return 0
    if args.rounds < 4:
        parser.error("--rounds must be at least 4 (the verdict uses quartiles).")
    result = compare(args)
    print(f"{'':<8} {'commit':<22} {'median step':>12}")
    print(f"{'base':<8} {result['base_commit'][:12]:<22} {result['base_step_s_median']:>10.3f} s")
    print(f"{'head':<8} {result['head_commit'][:22]:<22} {result['head_step_s_median']:>10.3f} s")
    print(
        f"head / base per round: median {result['ratio_median']:.3f} "
        f"(interquartile {result['ratio_q1']:.3f} .. {result['ratio_q3']:.3f})"
    )
    print("REGRESSION" if result["regression"] else "no regression beyond the noise")
    from benchmarks import results_io  # here: a worker runs this file inside the base tree

    results_io.write_json(args.out, result)
    return 1 if result["regression"] else 0


if __name__ == "__main__":
    sys.exit(main())
