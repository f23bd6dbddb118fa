"""The table and JSON of `benchmarks/gpu_check.sh`: each measured step against its target.

python -m benchmarks.gpu_summary OUT_DIR      (reads OUT_DIR/*.json, writes OUT_DIR/gpu_check.json)
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

# benchmark name -> (what it is, MFU target or None)
CHECKS = {
    "t5_base": ("T5.1.1-base bf16, fused attention", 0.45),
    "t5_base_xla": ("T5.1.1-base bf16, XLA attention", None),
    "t5_base_flash": ("T5.1.1-base bf16, Pallas flash kernel, bias in-kernel", None),
    "lm_1b": ("decoder-only ~1B bf16, fused attention", 0.55),
}


def summarise(out_dir: str) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for name, (what, target) in CHECKS.items():
        path = os.path.join(out_dir, f"{name}.json")
        if not os.path.exists(path):
            rows[name] = {"what": what, "target_mfu": target, "measured": False}
            continue
        with open(path) as f:
            r = json.load(f)
        rows[name] = {
            "what": what,
            "target_mfu": target,
            "measured": True,
            "params": r["params"],
            "step_s": r["step_s_median"],
            "tokens_per_s": r["tokens_per_s"],
            "mfu": r["mfu"],
            "compile_s": r["compile_s"],
            "device_peak_bytes": r["device_peak_bytes"],
            "device": r["device"],
            "met": None if target is None else r["mfu"] >= target,
        }
    decode_path = os.path.join(out_dir, "decode.json")
    if os.path.exists(decode_path):
        with open(decode_path) as f:
            rows["decode"] = json.load(f)["rows"]
    return rows


def print_table(rows: dict[str, Any]) -> None:
    print(
        f"\n{'check':<40} {'params':>14} {'step':>9} {'tokens/s':>12} {'MFU':>7} {'target':>7}  met"
    )
    for name, (what, _) in CHECKS.items():
        r = rows[name]
        if not r["measured"]:
            print(f"{what:<40} {'not measured':>14}")
            continue
        target = "-" if r["target_mfu"] is None else f"{r['target_mfu']:.0%}"
        met = "-" if r["met"] is None else ("yes" if r["met"] else "NO")
        print(
            f"{what:<40} {r['params']:>14,} {r['step_s'] * 1e3:>7.1f}ms "
            f"{r['tokens_per_s']:>12,.0f} {r['mfu']:>7.1%} {target:>7}  {met}"
        )
    for d in rows.get("decode", []):
        print(f"decode {d['method']:<7} batch {d['batch']:>3}: {d['tokens_per_s']:,.0f} tokens/s")


def main(argv: list[str] | None = None) -> int:
    out_dir = (argv or sys.argv[1:] or ["benchmarks/results/gpu"])[0]
    rows = summarise(out_dir)
    print_table(rows)
    path = os.path.join(out_dir, "gpu_check.json")
    with open(path, "w") as f:
        json.dump(rows, f, indent=2)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
