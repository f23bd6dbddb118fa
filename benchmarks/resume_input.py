"""How long a resumed run waits for its first batch: restoring the saved input position
against re-reading (skipping) every batch before the resume step.

    python -m benchmarks.resume_input [--pipelines span_corruption,bert_masking,packed_lm]
        [--batch 128] [--at 200]

For each objective (the real seqio tasks of `benchmarks.input_throughput`, on the offline
corpus) one stream (`train_data.HostBatches`, one data shard) reads `--at` batches and saves
its position the way a checkpoint does; then, each in a fresh stream, the time from building
the pipeline to the first batch after that position, (a) restored from the saved state and
(b) by skipping the `--at` batches before it (what every resume did before positions were
saved, and still does without one). Both first batches are checked equal. The skip grows
linearly with the resume step; the restore does not.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

import numpy as np

from benchmarks import results_io
from benchmarks.input_throughput import PIPELINES, _model
from t5x_like import storage, train_data


def _first_batch_s(
    order: train_data.DataOrder,
    lengths: dict[str, int],
    model: Any,
    at: int,
    restore_from: str | None,
) -> tuple[float, dict, str]:
    start = time.perf_counter()
    stream = train_data.HostBatches(
        order, lengths, start_batch=at, model=model, restore_from=restore_from
    )
    batch = next(stream)
    return time.perf_counter() - start, batch, stream.how_started


def run(names: list[str], batch_size: int, at: int) -> list[dict[str, Any]]:
    rows = []
    for name in names:
        task, lengths, family, _ = PIPELINES[name]
        model = _model(family, task)
        order = train_data.DataOrder(task, batch_size, seed=0, data_shards=1)
        stream = train_data.HostBatches(order, lengths, model=model)
        for _ in range(at):
            next(stream)
        directory = tempfile.mkdtemp(prefix="resume_input-")
        start = time.perf_counter()
        why_not = stream.save(directory)
        save_s = time.perf_counter() - start
        if why_not:
            raise RuntimeError(f"{name}: the position could not be saved: {why_not}")
        restore_s, restored, how = _first_batch_s(order, lengths, model, at, directory)
        assert how.startswith("restored"), how
        skip_s, skipped, how = _first_batch_s(order, lengths, model, at, None)
        assert how.startswith("skipped"), how
        for key in restored:
            np.testing.assert_array_equal(restored[key], skipped[key], err_msg=key)
        row: dict[str, Any] = {
            "pipeline": name,
            "task": task,
            "feature_lengths": lengths,
            "batch": batch_size,
            "resume_at_batch": at,
            "save_s": save_s,
            "state_bytes": sum(storage.file_sizes(directory).values()),
            "restore_first_batch_s": restore_s,
            "skip_first_batch_s": skip_s,
        }
        rows.append(row)
        print(
            f"{name:<16} at batch {at:,} of {batch_size}: save {save_s:.2f} s "
            f"({row['state_bytes'] / 2**20:.1f} MiB); first batch restored "
            f"{restore_s:.1f} s, skipped {skip_s:.1f} s",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipelines", default=",".join(PIPELINES))
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument(
        "--at", type=int, default=200, help="the resume position, in batches of this stream"
    )
    parser.add_argument("--out", default="benchmarks/results/resume_input.json")
    args = parser.parse_args(argv)
    rows = run(args.pipelines.split(","), args.batch, args.at)
    results_io.write_rows(args.out, rows)
    return rows


if __name__ == "__main__":
    main()
