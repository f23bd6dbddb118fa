"""Decoding throughput of T5 on the key/value cache: greedy and beam search, small and large
batches, against HuggingFace `generate` on the same weights.

    python -m benchmarks.decode_throughput [--gin_file F] [--gin B] [--batch_sizes 1,32]
        [--methods greedy,beam]
        [--beam_size 4] [--inputs 128] [--new_tokens 64] [--repeats 3] [--compare-hf]

The model is the standard benchmark config (`train_throughput.BENCHMARK_CONFIG`), randomly
initialised. Every run decodes exactly `--new_tokens` tokens per sequence (no end-of-sequence
stop: our EOS id is set to one the model cannot emit, HF gets `min_new_tokens`), so both sides
do the same work. Our decode is one jitted `predict_batch` (encoder + `lax.while_loop` over the
cache); time excludes compilation, which is reported apart. With `--compare-hf` the same
parameters are exported (`hf_t5.save_hf_checkpoint`) and loaded into transformers'
`T5ForConditionalGeneration`, timed with `torch.set_num_threads(all host cores)`; for greedy
decoding the table also gives the share of tokens both produce identically (same weights, so
only float rounding may flip an argmax).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

import jax
import numpy as np

from benchmarks import results_io
from benchmarks.train_throughput import BENCHMARK_CONFIG
from t5x_like import decoding
from t5x_like.families.t5.model import EncoderDecoderModel
from t5x_like.gin_setup import load_model_config
from t5x_like.models.base import unbox

NEVER_EMITTED = -1  # an EOS id outside the vocabulary: every sequence runs to full length


def _inputs(vocab_size: int, batch: int, length: int) -> np.ndarray:
    return np.random.default_rng(batch).integers(2, vocab_size, (batch, length)).astype(np.int32)


def time_ours(
    model: EncoderDecoderModel,
    params: Any,
    inputs: np.ndarray,
    method: str,
    beam_size: int,
    new_tokens: int,
    repeats: int,
) -> dict[str, Any]:
    config = decoding.DecodeConfig(method=method, beam_size=beam_size)
    decode = jax.jit(
        lambda p, x: model.predict_batch(p, {"encoder_input_tokens": x}, new_tokens, decode=config)
    )
    start = time.perf_counter()
    compiled = decode.lower(params, inputs).compile()
    compile_s = time.perf_counter() - start
    tokens = np.asarray(compiled(params, inputs))  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = np.asarray(compiled(params, inputs))
        times.append(time.perf_counter() - start)
    return {"compile_s": compile_s, "seconds": statistics.median(times), "tokens": tokens}


def load_hf(params: Any, cfg, threads: int):
    """transformers' T5 holding exactly `params` (exported, then read back)."""
    import torch
    import transformers

    from t5x_like.families.t5 import hf as hf_t5

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as directory:
        hf_t5.save_hf_checkpoint(directory, jax.device_get(params), cfg)
        model = transformers.T5ForConditionalGeneration.from_pretrained(directory)
    return model.eval()


def time_hf(
    model, inputs: np.ndarray, method: str, beam_size: int, new_tokens: int, repeats: int
) -> dict[str, Any]:
    import torch

    input_ids = torch.from_numpy(inputs.astype(np.int64))
    kwargs = dict(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        num_beams=beam_size if method == "beam" else 1,
        use_cache=True,
    )

    def generate():
        with torch.inference_mode():
            return model.generate(
                input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **kwargs
            )

    out = generate()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = generate()
        times.append(time.perf_counter() - start)
    # HF prepends the decoder start token.
    return {"seconds": statistics.median(times), "tokens": out[:, 1:].numpy()}


def run(
    cfg,
    batch_sizes: list[int],
    methods: list[str],
    beam_size: int,
    input_len: int,
    new_tokens: int,
    repeats: int,
    compare_hf: bool,
) -> list[dict[str, Any]]:
    model = EncoderDecoderModel(cfg, eos_id=NEVER_EMITTED)
    params = unbox(jax.jit(lambda k: model.init(k))(jax.random.key(0)))
    hf_model = load_hf(params, cfg, os.cpu_count() or 1) if compare_hf else None
    rows = []
    for batch in batch_sizes:
        inputs = _inputs(cfg.vocab_size, batch, input_len)
        for method in methods:
            ours = time_ours(model, params, inputs, method, beam_size, new_tokens, repeats)
            generated = batch * new_tokens
            row = {
                "method": method,
                "beam_size": beam_size if method == "beam" else 1,
                "batch": batch,
                "inputs": input_len,
                "new_tokens": new_tokens,
                "compile_s": ours["compile_s"],
                "seconds": ours["seconds"],
                "tokens_per_s": generated / ours["seconds"],
            }
            if hf_model is not None:
                hf = time_hf(hf_model, inputs, method, beam_size, new_tokens, repeats)
                row.update(
                    hf_seconds=hf["seconds"],
                    hf_tokens_per_s=generated / hf["seconds"],
                    speedup=hf["seconds"] / ours["seconds"],
                )
                if method == "greedy":
                    row["same_tokens"] = float(np.mean(hf["tokens"] == ours["tokens"]))
            rows.append(row)
            print_row(row)
    return rows


def print_row(row: dict[str, Any]) -> None:
    method = f"{row['method']}" + (f" (k={row['beam_size']})" if row["method"] == "beam" else "")
    line = (
        f"{method:<14} batch {row['batch']:>3}  compile {row['compile_s']:6.1f} s  "
        f"{row['seconds']:7.3f} s  {row['tokens_per_s']:9,.0f} tok/s"
    )
    if "hf_seconds" in row:
        line += (
            f"   HF {row['hf_seconds']:7.3f} s  {row['hf_tokens_per_s']:9,.0f} tok/s  "
            f"x{row['speedup']:.2f}"
        )
        if "same_tokens" in row:
            line += f"  same tokens {row['same_tokens']:.0%}"
    print(line, flush=True)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--gin_file",
        action="append",
        default=[],
        help="model gin file(s) instead of the benchmark config",
    )
    parser.add_argument(
        "--gin",
        action="append",
        default=[],
        dest="bindings",
        help="extra gin binding, e.g. --gin T5Config.num_decoder_layers=2",
    )
    parser.add_argument("--batch_sizes", default="1,32")
    parser.add_argument("--methods", default="greedy,beam")
    parser.add_argument("--beam_size", type=int, default=4)
    parser.add_argument("--inputs", type=int, default=128)
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--compare-hf",
        dest="compare_hf",
        action="store_true",
        help="also time transformers' generate on the same weights (test extra)",
    )
    parser.add_argument("--out", default="benchmarks/results/decode_throughput.json")
    args = parser.parse_args(argv)
    cfg = (
        load_model_config(args.gin_file, args.bindings)
        if args.gin_file or args.bindings
        else BENCHMARK_CONFIG
    )
    rows = run(
        cfg,
        [int(b) for b in args.batch_sizes.split(",")],
        args.methods.split(","),
        args.beam_size,
        args.inputs,
        args.new_tokens,
        args.repeats,
        args.compare_hf,
    )
    result = {
        "rows": rows,
        "config": cfg.to_json(),
        "device": str(jax.devices()[0].device_kind),
        "jax": jax.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    results_io.write_json(args.out, result)
    return rows


if __name__ == "__main__":
    main()
