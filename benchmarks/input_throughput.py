"""Input-pipeline throughput per host against what the train step consumes.

    python -m benchmarks.input_throughput [--pipelines span_corruption,bert_masking,packed_lm]
        [--batch 8] [--batches 500] [--step_steps 3]

For each objective the real seqio task (on the offline corpus, so nothing is downloaded) runs
through the real pipeline (`input_pipeline.get_dataset`: preprocessing, the model's feature
converter with packing, batching, prefetch), timed over `--batches` batches after the first
(which pays for building the corpus cache and tracing) and 20 more (the prefetch buffer). The
consumption rate is the trainer's
own step (`trainer.make_train_step`, Adafactor) of that family's benchmark config
(`benchmarks.families`, with the task's vocabulary) on the pipeline's own first batch; the ratio
pipeline / step is the headroom (the issue's target: at least 3x on one host).

  span_corruption  offline_span_corruption, T5 (inputs 512, targets 114: the paper's 15 % noise,
                   mean span 3)
  bert_masking     bert_offline_pretraining, BERT (128 tokens, 20 predictions: the paper's
                   15 % masking and next-sentence pairs)
  packed_lm        offline_lm, decoder-only (512-token packed sequences)

Tokens count every non-padding position the model reads (for T5, inputs + targets).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import statistics
import time
from typing import Any

import jax
import numpy as np

from benchmarks import results_io
from benchmarks.families import FAMILIES
from t5x_like import input_pipeline, partitioning, trainer

# The tasks the benchmark reads (by name: mypy cannot follow the package-dir that maps tasks/
# to t5x_like.tasks).
importlib.import_module("t5x_like.tasks")


def _vocab_size(task: str) -> int:
    features = input_pipeline.resolve_task(task).output_features
    return max(f.vocabulary.vocab_size for f in features.values())


def _model(family: str, task: str) -> Any:
    """The family's benchmark model with the task's vocabulary."""
    spec = FAMILIES[family]
    cfg = dataclasses.replace(spec.benchmark_config, vocab_size=_vocab_size(task))
    return spec.make_model(cfg, None)


# name -> (task, feature lengths, model family, the features that hold real tokens)
PIPELINES: dict[str, tuple[str, dict[str, int], str, tuple[str, ...]]] = {
    "span_corruption": (
        "offline_span_corruption",
        {"inputs": 512, "targets": 114},
        "t5",
        ("encoder_input_tokens", "decoder_target_tokens"),
    ),
    "bert_masking": (
        "bert_offline_pretraining",
        {"inputs": 128, "targets": 20},
        "bert",
        ("input_ids",),
    ),
    "packed_lm": ("offline_lm", {"targets": 512}, "decoder_only", ("decoder_target_tokens",)),
}


def _real_tokens(batch: dict[str, np.ndarray], token_features: tuple[str, ...]) -> int:
    return int(sum(np.count_nonzero(batch[k]) for k in token_features))


WARM_UP_BATCHES = 20


def time_pipeline(
    task: str,
    lengths: dict[str, int],
    model: Any,
    batch_size: int,
    num_batches: int,
    token_features: tuple[str, ...],
) -> dict[str, Any]:
    ds = input_pipeline.get_dataset(
        task, lengths, batch_size, "train", shuffle=True, seed=0, num_epochs=None, model=model
    )
    iterator = ds.as_numpy_iterator()
    start = time.perf_counter()
    first = next(iterator)
    first_s = time.perf_counter() - start
    for _ in range(WARM_UP_BATCHES):  # let the prefetch buffer fill and drain once
        next(iterator)
    tokens = 0
    start = time.perf_counter()
    for _ in range(num_batches):
        tokens += _real_tokens(next(iterator), token_features)
    seconds = time.perf_counter() - start
    return {
        "first_batch_s": first_s,
        "examples_per_s": num_batches * batch_size / seconds,
        "tokens_per_s": tokens / seconds,
        "batch": first,
    }


def time_step(family: str, model: Any, batch: dict[str, np.ndarray], steps: int) -> float:
    """Median seconds of the trainer's step on `batch` (one device), with the family's
    recipe optimizer."""
    lr, optimizer = FAMILIES[family].make_optimizer()
    mesh = partitioning.make_mesh(mesh_shape=(1, 1), devices=jax.devices()[:1])
    rules = partitioning.logical_axis_rules("auto", num_partitions=1)
    layout = trainer.make_layout(model, optimizer, mesh, rules)
    state = trainer.init_state(model, optimizer, jax.random.key(0), layout)
    data = partitioning.global_batch(batch, mesh, rules)
    step = trainer.make_train_step(model, optimizer, lr, layout)
    rng = jax.random.key(1)
    with layout.context():
        compiled = step.lower(state, data, rng).compile()
    state, metrics = compiled(state, data, rng)
    jax.block_until_ready(metrics)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        state, metrics = compiled(state, data, rng)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(
    names: list[str], batch_size: int, num_batches: int, step_steps: int
) -> list[dict[str, Any]]:
    rows = []
    for name in names:
        task, lengths, family, token_features = PIPELINES[name]
        model = _model(family, task)
        timed = time_pipeline(task, lengths, model, batch_size, num_batches, token_features)
        batch = timed.pop("batch")
        row = {
            "pipeline": name,
            "task": task,
            "feature_lengths": lengths,
            "batch": batch_size,
            **timed,
        }
        if step_steps:
            step_s = time_step(family, model, batch, step_steps)
            row.update(
                step_s=step_s,
                step_examples_per_s=batch_size / step_s,
                headroom=row["examples_per_s"] / (batch_size / step_s),
            )
        rows.append(row)
        print_row(row)
    return rows


def print_row(row: dict[str, Any]) -> None:
    line = (
        f"{row['pipeline']:<16} {row['examples_per_s']:9,.0f} ex/s "
        f"{row['tokens_per_s']:11,.0f} tok/s  (first batch {row['first_batch_s']:.1f} s)"
    )
    if "step_s" in row:
        line += (
            f"   step {row['step_s']:.3f} s = {row['step_examples_per_s']:7,.1f} ex/s   "
            f"headroom x{row['headroom']:,.1f}"
        )
    print(line, flush=True)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipelines", default=",".join(PIPELINES))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument(
        "--batches",
        type=int,
        default=500,
        help="batches timed (enough that prefetched ones do not dominate)",
    )
    parser.add_argument(
        "--step_steps",
        type=int,
        default=3,
        help="train steps timed for the consumption rate (0: skip)",
    )
    parser.add_argument("--out", default="benchmarks/results/input_throughput.json")
    args = parser.parse_args(argv)
    rows = run(args.pipelines.split(","), args.batch, args.batches, args.step_steps)
    results_io.write_rows(args.out, rows)
    return rows


if __name__ == "__main__":
    main()
