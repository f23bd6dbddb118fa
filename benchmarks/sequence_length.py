"""Train-step time against sequence length: the attention cost curve.

    python -m benchmarks.sequence_length [--lengths 128,256,512,1024,2048]
        [--tokens_per_batch 4096] [--steps 2] [ARGS of train_throughput: --dtype, --remat_policy,
        --loss_chunk_length, --scan_layers]

The standard benchmark config with inputs of each length L, targets L/4 (span corruption's
ratio) and the batch chosen so every step reads about the same number of tokens
(`--tokens_per_batch` input tokens). Dense-layer FLOPs per token are then constant and only
attention (whose score matrices grow as L^2) makes a longer step cost more per token: the table
shows step time, tokens/s, MFU and the share of the model FLOPs that are attention scores.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Any

from benchmarks import results_io, train_throughput
from t5x_like.families.t5.network import T5Config


def score_flops(cfg: T5Config, inputs: int, targets: int, batch: int) -> float:
    """Training FLOPs of the attention score products (QK^T and AV) alone."""
    inner = cfg.num_heads * cfg.head_dim
    per_example = (
        4
        * inner
        * (
            cfg.num_encoder_layers * inputs * inputs
            + cfg.num_decoder_layers * (targets * targets + targets * inputs)
        )
    )
    return 3.0 * per_example * batch


def run(
    lengths: list[int],
    tokens_per_batch: int,
    steps: int,
    cfg: T5Config,
    loss_chunk_length: int | None,
) -> list[dict[str, Any]]:
    rows = []
    for length in lengths:
        batch = max(1, tokens_per_batch // length)
        targets = max(1, length // 4)
        result = train_throughput.run(
            cfg, batch, length, targets, steps, loss_chunk_length=loss_chunk_length
        )
        row = {
            "inputs": length,
            "targets": targets,
            "batch": batch,
            "step_s": result["step_s_median"],
            "tokens_per_s": result["tokens_per_s"],
            "mfu": result["mfu"],
            "xla_step_bytes": result["xla_step_bytes"],
            "attention_score_share": score_flops(cfg, length, targets, batch)
            / result["flops_per_step"],
        }
        rows.append(row)
        print(
            f"L={length:>5} (targets {targets:>4}, batch {batch:>3})  step "
            f"{row['step_s']:7.2f} s  {row['tokens_per_s']:7,.0f} tok/s  MFU "
            f"{row['mfu']:5.1%}  attention scores {row['attention_score_share']:5.1%} of "
            f"FLOPs  memory {train_throughput._fmt_bytes(row['xla_step_bytes'])}",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="128,256,512,1024,2048")
    parser.add_argument("--tokens_per_batch", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--remat_policy", default="none")
    parser.add_argument("--scan_layers", action="store_true")
    parser.add_argument("--attention_implementation", default="xla")
    parser.add_argument("--loss_chunk_length", type=int, default=None)
    parser.add_argument("--out", default="benchmarks/results/sequence_length.json")
    args = parser.parse_args(argv)
    cfg = dataclasses.replace(
        train_throughput.BENCHMARK_CONFIG,
        dtype=args.dtype,
        remat_policy=args.remat_policy,
        scan_layers=args.scan_layers,
        attention_implementation=args.attention_implementation,
    )
    rows = run(
        [int(x) for x in args.lengths.split(",")],
        args.tokens_per_batch,
        args.steps,
        cfg,
        args.loss_chunk_length,
    )
    results_io.write_json(
        args.out,
        {"rows": rows, "config": cfg.to_json(), "date": time.strftime("%Y-%m-%d %H:%M:%S")},
    )
    return rows


if __name__ == "__main__":
    main()
