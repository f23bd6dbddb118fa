"""Checkpoint save time on one data-parallel host: the train-state Checkpointer with t5x_like's
array handler against orbax's default (replica-parallel) handler.

    python -m benchmarks.checkpoint_save [--devices 8] [--saves 3]

Each variant runs in its own process (jax compiles and caches per process; the device count is
fixed when jax starts) on the standard benchmark config's train state (parameters and
Adafactor state) replicated over `--devices` simulated CPU devices. A save is timed from the
call to the end of its asynchronous write; XLA compilations during each save are counted.
Prints a table and writes benchmarks/results/checkpoint_save.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks import results_io

VARIANTS = ("t5x_like", "orbax_default")


class _CompileCounter(logging.Handler):
    """Counts jax's "Finished XLA compilation" log lines (jax.log_compiles)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += "XLA compilation" in record.getMessage()


def measure(variant: str, saves: int) -> dict[str, Any]:
    """Save the replicated train state `saves` times with `variant`'s array handler."""
    import jax
    import orbax.checkpoint as ocp

    from benchmarks.families import FAMILIES
    from t5x_like import optimizers, partitioning, trainer
    from t5x_like.checkpoints import train_state

    family = FAMILIES["t5"]
    cfg = family.benchmark_config
    model = family.make_model(cfg, None)
    optimizer = optimizers.t5_adafactor(optimizers.inverse_sqrt_schedule())
    mesh = partitioning.make_mesh(mesh_shape=(jax.device_count(), 1))
    layout = trainer.make_layout(
        model, optimizer, mesh, partitioning.logical_axis_rules("data_parallel")
    )
    state = trainer.init_state(model, optimizer, jax.random.key(0), layout)
    checkpointer = train_state.Checkpointer(tempfile.mkdtemp(), keep=None)
    if variant == "orbax_default":  # undo t5x_like's registration: orbax's own handler
        ocp.type_handlers.register_type_handler(
            jax.Array, ocp.type_handlers.ArrayHandler(), override=True
        )
    counter = _CompileCounter()
    logging.getLogger("jax").addHandler(counter)
    times, compiles = [], []
    for _ in range(saves):
        state = state.replace(step=state.step + 1)
        counter.count = 0
        start = time.perf_counter()
        with jax.log_compiles(True):
            checkpointer.save(state, cfg)
            checkpointer.manager.wait_until_finished()
        times.append(time.perf_counter() - start)
        compiles.append(counter.count)
    leaves = jax.tree_util.tree_leaves(state)
    return {
        "variant": variant,
        "devices": jax.device_count(),
        "arrays": len(leaves),
        "bytes": sum(x.nbytes for x in leaves),
        "save_s": times,
        "compiles": compiles,
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--saves", type=int, default=3)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # (child)
    parser.add_argument("--out", default="benchmarks/results/checkpoint_save.json")
    args = parser.parse_args(argv)
    if args.variant:
        print(json.dumps(measure(args.variant, args.saves)))
        return []
    env = {
        **os.environ,
        "XLA_FLAGS": (
            os.environ.get("XLA_FLAGS", "")
            + f" --xla_force_host_platform_device_count={args.devices}"
        ),
    }
    results = []
    for variant in VARIANTS:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.checkpoint_save",
                "--variant",
                variant,
                "--saves",
                str(args.saves),
            ],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    print("| handler | devices | arrays | MiB | save s (first, later...) | XLA compiles |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['variant']} | {r['devices']} | {r['arrays']} | {r['bytes'] / 2**20:,.0f} | "
            f"{', '.join(f'{t:.2f}' for t in r['save_s'])} | "
            f"{', '.join(map(str, r['compiles']))} |"
        )
    results_io.write_json(args.out, results)
    return results


if __name__ == "__main__":
    main()
