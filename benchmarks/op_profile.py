"""Where a compiled step spends its time, op by op, from a jax profiler trace.

`train_throughput --profile` calls `profile` on the compiled train step: it runs a few steps
under `jax.profiler.trace` (a Perfetto trace), sums the duration of every XLA op event by name
and by kind (the name without its numeric suffix: `fusion`, `dot`, `scatter`, ...) and prints
the largest, with their share of the profiled time. The raw trace stays in the output
directory for TensorBoard / Perfetto.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
from typing import Any, Callable

import jax

_SUFFIX = re.compile(r"[._]\d+$")
# HLO instruction names: lower case, digits, '_', '-', '.' (`fusion.12`, `dot.3`, and the first
# of a kind without a number, `ynn_fusion`). Runtime spans have capitals, '::', '(' or spaces
# (`ThunkExecutor::Execute`, `ParseArguments`), Python frames a '$'.
_HLO_NAME = re.compile(r"[a-z][a-z0-9_.\-]*")


def _events(trace_dir: str) -> list[dict[str, Any]]:
    paths = glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True)
    if not paths:
        raise FileNotFoundError(f"No perfetto_trace.json.gz under {trace_dir}.")
    with gzip.open(max(paths, key=os.path.getmtime)) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def _op_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The XLA op events: names that look like HLO instructions, not the Python / runtime
    spans around them. (Requiring a numeric suffix, as this once did, dropped the first op of
    each kind: the 400 ms `ynn_fusion` of the standard step went unseen.)"""
    return [e for e in events if _HLO_NAME.fullmatch(e["name"])]


def summarise(events: list[dict[str, Any]], steps: int, top: int = 25) -> dict[str, Any]:
    ops = _op_events(events)
    total = sum(e["dur"] for e in ops) or 1.0
    by_name: dict[str, float] = collections.defaultdict(float)
    by_kind: dict[str, float] = collections.defaultdict(float)
    count: dict[str, int] = collections.Counter()
    for e in ops:
        by_name[e["name"]] += e["dur"]
        by_kind[_SUFFIX.sub("", e["name"])] += e["dur"]
        count[e["name"]] += 1

    def rows(table, n):
        return [
            {"name": k, "ms_per_step": v / 1e3 / steps, "share": v / total}
            for k, v in sorted(table.items(), key=lambda kv: -kv[1])[:n]
        ]

    return {
        "op_ms_per_step": total / 1e3 / steps,
        "by_kind": rows(by_kind, top),
        "by_op": [{**r, "calls_per_step": count[r["name"]] / steps} for r in rows(by_name, top)],
    }


def profile(
    run_step: Callable[[], Any], trace_dir: str, steps: int = 2, top: int = 25
) -> dict[str, Any]:
    """Trace `steps` calls of `run_step` (which must block until done) into `trace_dir` and
    summarise the XLA ops."""
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        for _ in range(steps):
            run_step()
    return summarise(_events(trace_dir), steps, top)


def print_profile(summary: dict[str, Any]) -> None:
    print(f"\nXLA op time per step: {summary['op_ms_per_step']:,.1f} ms (summed over threads)")
    print(f"{'op kind':<40} {'ms/step':>10} {'share':>7}")
    for r in summary["by_kind"]:
        print(f"{r['name']:<40} {r['ms_per_step']:>10.1f} {r['share']:>7.1%}")
    print(f"\n{'op':<40} {'ms/step':>10} {'share':>7} {'calls':>6}")
    for r in summary["by_op"]:
        print(
            f"{r['name']:<40} {r['ms_per_step']:>10.1f} {r['share']:>7.1%} "
            f"{r['calls_per_step']:>6.0f}"
        )
