"""Each performance knob against the same train step without it, interleaved step by step.

    python -m benchmarks.knob_effect [--family t5] [--rounds 6] [--knob "--dtype bfloat16" ...]

A 2-core VM's speed drifts by ±7 % and more within minutes, so knobs timed in runs one after
the other (`train_throughput ARGS`, then `train_throughput`) cannot show a 5 % effect. Here one
worker process compiles the family's standard benchmark step as it is, and one worker per knob
compiles it with that knob (`train_throughput`'s own arguments: `--dtype`, `--remat_policy`,
`--scan_layers`, `--loss_chunk_length`, `--gin ...`); the two steps alternate A B B A
(`benchmarks.interleave`), so each round's ratio sees one machine. Per knob it prints both
median steps, the ratio knob / plain (median and interquartile range), XLA's step memory and
compile time on each side, and the first step's loss on each side: a knob should change speed
and memory, never the result (bfloat16 moves the loss by its rounding, nothing else should).
Writes JSON.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from typing import Any

from benchmarks import interleave, results_io, train_throughput


def _fused_attention(config_class: str) -> str:
    return f"--gin {config_class}.attention_implementation='dot_product_attention'"


# The knobs of issue 9 each family has: mixed precision, jax's fused attention (XLA's on CPU),
# rematerialisation and the scanned stack, and the chunked loss (T5 and GPT: BERT predicts only
# its masked positions).
DEFAULT_KNOBS = {
    "t5": (
        "--dtype bfloat16",
        _fused_attention("T5Config"),
        "--loss_chunk_length 32",
        "--remat_policy full",
        "--remat_policy save_qkv_proj",
        "--scan_layers",
        "--scan_layers --remat_policy dots",
    ),
    "decoder_only": (
        "--dtype bfloat16",
        _fused_attention("GPTConfig"),
        "--loss_chunk_length 32",
        "--remat_policy full",
        "--scan_layers",
        "--scan_layers --remat_policy dots",
    ),
    "bert": (
        "--dtype bfloat16",
        _fused_attention("BertConfig"),
        "--remat_policy full",
        "--scan_layers",
        "--scan_layers --remat_policy dots",
    ),
}


def step_parser() -> argparse.ArgumentParser:
    """What one side's step is built from: `train_throughput`'s model options and its loss
    chunking."""
    parser = argparse.ArgumentParser(prog="knob_effect worker", add_help=False)
    train_throughput.add_model_arguments(parser)
    parser.add_argument("--loss_chunk_length", type=int, default=None)
    return parser


def check_step_arguments(argv: list[str]) -> None:
    """Parse and apply `argv` to the model config here, so a misspelt knob or a value the
    config refuses fails before any worker compiles."""
    try:
        args = step_parser().parse_args(argv)
    except SystemExit:
        raise SystemExit(
            f"knob_effect: {shlex.join(argv)!r} is not a step the benchmark can "
            f"build (see the error above; `python -m benchmarks.train_throughput "
            f"--help` lists the options)."
        ) from None
    try:
        train_throughput.model_config(args)
    except (ValueError, TypeError) as error:
        raise SystemExit(f"knob_effect: {shlex.join(argv)!r}: {error}") from None


def _worker(argv: list[str]) -> None:
    """Runs in its own process: build and compile the step `argv` describes, take one step,
    say what it measured, then serve one step per request (`interleave.serve`)."""
    args = step_parser().parse_args(argv)
    cfg = train_throughput.model_config(args)
    built = train_throughput.build_step(
        cfg, args.batch, args.inputs, args.targets, loss_chunk_length=args.loss_chunk_length
    )
    start = time.perf_counter()
    compiled = built.compile()
    compile_s = time.perf_counter() - start
    one_step = train_throughput.SteppedState(built, compiled)
    first_loss = float(one_step()["loss"])  # also the warm-up
    about = {
        "compile_s": compile_s,
        "xla_step_bytes": train_throughput.xla_step_bytes(compiled),
        "first_loss": first_loss,
    }
    interleave.serve(interleave.timed(one_step), about=json.dumps(about))


def _start_worker(argv: list[str], name: str) -> interleave.StepServer:
    return interleave.StepServer(
        [sys.executable, "-m", "benchmarks.knob_effect", "--worker", "--", *argv], name=name
    )


def _side(server: interleave.StepServer, times: list[float]) -> dict[str, Any]:
    return {**json.loads(server.about), "step_s_median": statistics.median(times), "steps_s": times}


def run(args: argparse.Namespace) -> dict[str, Any]:
    plain_argv = [
        "--family",
        args.family,
        "--batch",
        str(args.batch),
        "--inputs",
        str(args.inputs),
        "--targets",
        str(args.targets),
        *shlex.split(args.base),
    ]
    knobs = args.knob or list(DEFAULT_KNOBS[args.family])
    for argv in [plain_argv, *(plain_argv + shlex.split(knob) for knob in knobs)]:
        check_step_arguments(argv)
    rows = []
    plain = _start_worker(plain_argv, "plain step")
    try:
        plain.wait_ready()  # its compile first, alone, so neither slows the other's
        for knob in knobs:
            with_knob = _start_worker(plain_argv + shlex.split(knob), f"step with {knob}")
            try:
                with_knob.wait_ready()
                plain_times, knob_times, ratios = interleave.alternate(
                    plain.step, with_knob.step, args.rounds
                )  # ratio: knob over plain
            finally:
                with_knob.close()
            rows.append(
                {
                    "knob": knob,
                    "plain": _side(plain, plain_times),
                    "with_knob": _side(with_knob, knob_times),
                    "ratios": ratios,
                    **interleave.quartiles(ratios),
                }
            )
    finally:
        plain.close()
    return {
        "family": args.family,
        "plain_args": shlex.join(plain_argv),
        "rounds": args.rounds,
        "knobs": rows,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def _mib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:,.0f}"


def print_table(result: dict[str, Any]) -> None:
    print(f"{result['family']}: {result['plain_args']}, {result['rounds']} A B B A rounds per knob")
    header = (
        f"{'knob':<30} {'plain s':>8} {'knob s':>8} {'knob/plain (IQR)':>22} "
        f"{'XLA MiB plain/knob':>19} {'compile s':>12} {'first loss plain/knob':>24}"
    )
    print(header)
    print("-" * len(header))
    for row in result["knobs"]:
        plain, knob = row["plain"], row["with_knob"]
        ratio = f"{row['ratio_median']:.3f} ({row['ratio_q1']:.3f}-{row['ratio_q3']:.3f})"
        memory = f"{_mib(plain['xla_step_bytes'])} / {_mib(knob['xla_step_bytes'])}"
        compile_s = f"{plain['compile_s']:.1f} / {knob['compile_s']:.1f}"
        loss = f"{plain['first_loss']:.5f} / {knob['first_loss']:.5f}"
        print(
            f"{row['knob']:<30} {plain['step_s_median']:>8.3f} {knob['step_s_median']:>8.3f} "
            f"{ratio:>22} {memory:>19} {compile_s:>12} {loss:>24}"
        )


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        _worker(argv[2:] if argv[1:2] == ["--"] else argv[1:])
        return None
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="t5", choices=sorted(DEFAULT_KNOBS))
    parser.add_argument(
        "--knob",
        action="append",
        default=[],
        help="train_throughput arguments that make the step under test, e.g. "
        "--knob '--dtype bfloat16' (repeatable; default: the family's "
        "knobs in DEFAULT_KNOBS)",
    )
    parser.add_argument(
        "--base", default="", help="arguments both sides share, e.g. '--gin T5Config.num_heads=8'"
    )
    parser.add_argument("--rounds", type=int, default=6, help="A B B A rounds per knob (>= 4)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--inputs", type=int, default=512)
    parser.add_argument("--targets", type=int, default=128)
    parser.add_argument("--out", default="benchmarks/results/knob_effect.json")
    args = parser.parse_args(argv)
    if args.rounds < 4:
        parser.error("--rounds must be at least 4 (the ratios are reported as quartiles).")
    result = run(args)
    print_table(result)
    results_io.write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
