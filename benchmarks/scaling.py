"""Scaling report: the standard benchmark config on 1, 2, 4 and 8 simulated CPU devices for each
layout, plus the memory planner's numbers for large models on pod-sized meshes.

    python -m benchmarks.scaling [--steps 3] [--skip_plans] [--skip_train] [--with_11b]

Each configuration runs in its own process (the device count is fixed when jax starts).
Simulated devices share the machine's cores, so step times show the overhead of the
partitioned program, not a speed-up. Prints a table and writes benchmarks/results/scaling.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from benchmarks import results_io

# (devices, mesh data x model, layout)
RUNS = [
    (1, (1, 1), "data_parallel"),
    (2, (2, 1), "data_parallel"),
    (2, (1, 2), "model_parallel"),
    (2, (2, 1), "fsdp"),
    (4, (4, 1), "data_parallel"),
    (4, (2, 2), "model_parallel"),
    (4, (4, 1), "fsdp"),
    (8, (8, 1), "data_parallel"),
    (8, (4, 2), "model_parallel"),
    (8, (2, 4), "model_parallel"),
    (8, (8, 1), "fsdp"),
    (8, (4, 2), "fsdp"),
]
# (model gin, devices, mesh, layout, batch): v4-32 = 16 chips, v5p-128 = 64 chips.
PLANS = [
    ("gin_configs/models/t5_1_0/base.gin", 16, (16, 1), "data_parallel", 128),
    ("gin_configs/models/t5_1_0/base.gin", 16, (8, 2), "fsdp", 128),
    ("gin_configs/models/t5_1_0/base.gin", 64, (32, 2), "fsdp", 128),
]
# T5-11B takes 12+ minutes of CPU compilation per plan (48 unrolled layers); opt in.
PLANS_11B = [
    ("gin_configs/models/t5_1_0/11B.gin", 16, (2, 8), "fsdp", 128),
    ("gin_configs/models/t5_1_0/11B.gin", 64, (8, 8), "fsdp", 128),
]


def _run(cmd: list[str], devices: int, out_flag: str) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    done = subprocess.run(cmd + [f"{out_flag}={out}"], env=env, capture_output=True, text=True)
    if done.returncode:
        return {"error": (done.stderr or done.stdout)[-500:]}
    with open(out) as f:
        return json.load(f)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--skip_plans", action="store_true")
    parser.add_argument("--skip_train", action="store_true")
    parser.add_argument("--with_11b", action="store_true", help="also plan T5-11B (slow)")
    parser.add_argument("--out", default="benchmarks/results/scaling.json")
    args = parser.parse_args(argv)

    results: dict[str, list] = {"train": [], "plans": []}
    print(
        f"{'devices':>7} {'mesh':>6} {'layout':<15} {'step s':>8} {'tokens/s':>9} "
        f"{'MiB/device':>10}"
    )
    for devices, mesh, layout in [] if args.skip_train else RUNS:
        r = _run(
            [
                sys.executable,
                "-m",
                "benchmarks.train_throughput",
                f"--steps={args.steps}",
                f"--mesh_shape={mesh[0]},{mesh[1]}",
                f"--layout={layout}",
            ],
            devices,
            "--out",
        )
        r.update(devices=devices, mesh_shape=mesh, layout=layout)
        results["train"].append(r)
        if "error" in r:
            print(f"{devices:>7} {mesh[0]}x{mesh[1]:<4} {layout:<15} error: {r['error'][-120:]}")
            continue
        print(
            f"{devices:>7} {mesh[0]}x{mesh[1]:<4} {layout:<15} {r['step_s_median']:>8.2f} "
            f"{r['tokens_per_s']:>9,.0f} {r['xla_step_bytes'] / 2**20:>10,.0f}",
            flush=True,
        )

    if not args.skip_plans:
        print(
            f"\n{'model':<40} {'devices':>7} {'mesh':>6} {'layout':<14} {'params GiB':>10} "
            f"{'opt GiB':>8} {'temp GiB':>8} {'peak GiB':>8}  fits"
        )
        for gin_file, devices, mesh, layout, batch in PLANS + (PLANS_11B if args.with_11b else []):
            r = _run(
                [
                    sys.executable,
                    "-m",
                    "t5x_like.plan",
                    f"--gin_file={gin_file}",
                    f"--num_devices={devices}",
                    f"--mesh_shape={mesh[0]},{mesh[1]}",
                    f"--layout={layout}",
                    f"--batch_size={batch}",
                ],
                devices,
                "--json",
            )
            results["plans"].append({"gin_file": gin_file, **r})
            if "error" in r:
                print(f"{gin_file:<40} error: {r['error'][-120:]}")
                continue
            b = r["bytes_per_device"]
            fits = ", ".join(k for k, ok in r["fits"].items() if ok) or "none"
            print(
                f"{gin_file:<40} {devices:>7} {mesh[0]}x{mesh[1]:<4} {layout:<14} "
                f"{b['parameters'] / 2**30:>10.2f} {b['optimizer_state'] / 2**30:>8.2f} "
                f"{b['temporaries'] / 2**30:>8.2f} {b['peak_estimate'] / 2**30:>8.2f}  {fits}",
                flush=True,
            )
    results_io.write_json(args.out, results)


if __name__ == "__main__":
    main()
