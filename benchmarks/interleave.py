"""Timing two train steps side by side, one step at a time, so a shared machine's drift cancels.

A 2-core VM's speed drifts by ±7 % and more within minutes, so two benchmark runs one after
the other cannot tell a 5 % difference. Here each side is a callable that runs one step and
returns its seconds: an in-process step, or a `StepServer` - a worker process that compiled its
step and answers each 'step' line on its stdin with the seconds one step took (`serve`). The
steps alternate A B B A (then B A A B, ...), and each round gives one ratio.

Used by `step_regression` (this checkout against another commit) and `train_throughput
--compare-hf` (our step against HuggingFace's PyTorch step).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from typing import Any, Callable

Step = Callable[[], float]


def timed(step: Callable[[], Any]) -> Step:
    """A step that blocks until done (call `block_until_ready` inside) as a timed step."""

    def run() -> float:
        start = time.perf_counter()
        step()
        return time.perf_counter() - start

    return run


def serve(step: Step, about: str = "") -> None:
    """Worker side: say 'ready' (followed by `about`, what the worker wants its parent to
    know), then run one step per 'step' line read from stdin and answer with its seconds; any
    other line or end of input ends the loop."""
    print(f"ready {about}".strip(), flush=True)
    for line in sys.stdin:
        if line.strip() != "step":
            break
        print(f"{step():.6f}", flush=True)


class StepServer:
    """A worker process started with `command` that answers as `serve` does."""

    def __init__(
        self,
        command: list[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        name: str = "worker",
    ):
        self.name = name
        self.proc = subprocess.Popen(
            command, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self._ready = False
        self.about = ""  # what the worker said after 'ready'

    def wait_ready(self) -> None:
        """Block until the worker has compiled and warmed up its step."""
        if not self._ready:
            line = self.proc.stdout.readline().strip()
            if line.split(" ", 1)[0] != "ready":
                try:
                    code = self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:  # it said something else and went on
                    self.proc.kill()
                    code = self.proc.wait()
                raise SystemExit(
                    f"The {self.name} process failed to start (its output is "
                    f"above; exit code {code})."
                )
            self.about = line[len("ready") :].strip()
            self._ready = True

    def step(self) -> float:
        self.wait_ready()
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self, timeout: float = 120) -> None:
        """End the worker's loop and wait for it to finish (it may write its results then)."""
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        self.proc.wait(timeout=timeout)


def alternate(a: Step, b: Step, rounds: int) -> tuple[list[float], list[float], list[float]]:
    """Run `rounds` rounds A B B A / B A A B; returns A's and B's step times and one ratio per
    round: the mean of its two B steps over the mean of its two A steps."""
    times: dict[str, list[float]] = {"a": [], "b": []}
    steps = {"a": a, "b": b}
    for r in range(rounds):
        for name in ("a", "b", "b", "a") if r % 2 == 0 else ("b", "a", "a", "b"):
            times[name].append(steps[name]())
    ratios = [
        (times["b"][2 * r] + times["b"][2 * r + 1]) / (times["a"][2 * r] + times["a"][2 * r + 1])
        for r in range(rounds)
    ]
    return times["a"], times["b"], ratios


def quartiles(ratios: list[float]) -> dict[str, float]:
    """Median and interquartile range of the per-round ratios."""
    q1, median, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return {"ratio_median": median, "ratio_q1": q1, "ratio_q3": q3}
