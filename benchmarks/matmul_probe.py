"""The device's matmul rate, sampled on request from its own process.

`train_throughput` samples the rate of a 2048² float32 matmul right before and after each
timed CPU step (`train_throughput.paired_mfu`). Sampled in the benchmark's own process, the
probe's allocations between steps fragmented the host heap now and then, so the next step's
1.3 GB temporary buffer came from fresh memory and the reported peak RSS grew by that much
(2.1 -> 3.3 GB in about half of the `--compare-hf` runs). Here it runs as a worker that
answers each 'step' line with the seconds one product took (`interleave.serve`), under the
fastest of XLA CPU's matmul libraries (`hardware.matmul_timer`), which it names on start.

    python -m benchmarks.matmul_probe [--dtype float32] [--size 2048]
"""

from __future__ import annotations

import argparse
import sys

from benchmarks import interleave
from t5x_like import hardware


def command(dtype: str, size: int) -> list[str]:
    """The command line of a worker for `interleave.StepServer`."""
    return [sys.executable, "-m", "benchmarks.matmul_probe", "--dtype", dtype, "--size", str(size)]


def rate(seconds: float, size: int) -> float:
    """FLOP/s of one size x size product that took `seconds`."""
    return hardware.matmul_flop_count(size) / seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--size", type=int, default=2048)
    args = parser.parse_args(argv)
    timer = hardware.matmul_timer(args.dtype, args.size)
    interleave.serve(timer, about=timer.library)


if __name__ == "__main__":
    main()
