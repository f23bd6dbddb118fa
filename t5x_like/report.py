"""Summarise a training run from its TensorBoard event files: a table on the console and PNG
plots of loss, learning rate and throughput.

    python -m t5x_like.report MODEL_DIR [--output_dir DIR]

Reads MODEL_DIR/tensorboard (what `t5x_like.train` writes, locally or on gs://) and saves
loss.png, learning_rate.png and throughput.png in DIR (default MODEL_DIR/report).
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
from typing import Sequence

from t5x_like import storage

Series = list[tuple[int, float]]


def read_scalars(model_dir: str) -> dict[str, Series]:
    """Every scalar the run logged, by tag ('train/loss', 'eval/loss', ...), step-ordered."""
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    directory = os.path.join(model_dir, "tensorboard")
    accumulator = event_accumulator.EventAccumulator(
        directory, size_guidance={event_accumulator.TENSORS: 0, event_accumulator.SCALARS: 0}
    )
    accumulator.Reload()
    tags = accumulator.Tags()
    series: dict[str, Series] = {}
    for tag in tags.get("tensors", []):
        series[tag] = [
            (e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
            for e in accumulator.Tensors(tag)
        ]
    for tag in tags.get("scalars", []):
        series[tag] = [(e.step, float(e.value)) for e in accumulator.Scalars(tag)]
    return {tag: sorted(points) for tag, points in series.items() if points}


def summary_rows(series: dict[str, Series]) -> list[tuple[str, str]]:
    """(what, value) lines of the run's summary table."""
    rows: list[tuple[str, str]] = []
    if "train/loss" in series:
        step, loss = series["train/loss"][-1]
        rows += [("last step", f"{step:,}"), ("final train loss", f"{loss:.4f}")]
    if "eval/loss" in series:
        step, loss = min(series["eval/loss"], key=lambda p: p[1])
        rows.append(("best eval loss", f"{loss:.4f} (step {step:,})"))
    if "train/learning_rate" in series:
        rows.append(("final learning rate", f"{series['train/learning_rate'][-1][1]:.3e}"))
    steady = {
        tag: [v for _, v in points[1:] or points]  # the first window includes compiling
        for tag, points in series.items()
    }
    for tag, label, fmt in (
        ("train/tokens_per_s", "tokens/s (median)", "{:,.0f}"),
        ("train/step_time_s", "step time s (median)", "{:.3f}"),
        ("train/mfu", "MFU (median)", "{:.1%}"),
    ):
        if tag in steady:
            rows.append((label, fmt.format(statistics.median(steady[tag]))))
    for tag in sorted(t for t in series if t.startswith("eval/") and t.count("/") == 2):
        step, value = max(series[tag], key=lambda p: p[1])
        rows.append((f"best {tag[len('eval/') :]}", f"{value:.2f} (step {step:,})"))
    return rows


def plot(series: dict[str, Series], output_dir: str) -> list[str]:
    """loss.png, learning_rate.png and throughput.png (those with data); their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = {
        "loss.png": ([("train/loss", "train"), ("eval/loss", "eval")], "loss"),
        "learning_rate.png": ([("train/learning_rate", "learning rate")], "learning rate"),
        "throughput.png": ([("train/tokens_per_s", "tokens/s")], "tokens/s"),
    }
    written = []
    for name, (curves, ylabel) in figures.items():
        curves = [(tag, label) for tag, label in curves if tag in series]
        if not curves:
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        for tag, label in curves:
            steps, values = zip(*series[tag])
            ax.plot(steps, values, marker=".", label=label)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        if name == "throughput.png" and "train/mfu" in series:
            right = ax.twinx()
            steps, values = zip(*series["train/mfu"])
            right.plot(
                steps, [100 * v for v in values], color="tab:orange", marker=".", label="MFU"
            )
            right.set_ylabel("MFU (%)")
        ax.legend(loc="best")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = os.path.join(output_dir, name)
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=100)
        storage.write_bytes(path, png.getvalue())
        plt.close(fig)
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("--output_dir", default=None)
    args = parser.parse_args(argv)
    model_dir = storage.resolve(args.model_dir)
    if not storage.isdir(os.path.join(model_dir, "tensorboard")):
        print(
            f"error: {args.model_dir} has no tensorboard/ directory; give a run's MODEL_DIR.",
            file=sys.stderr,
        )
        return 2
    series = read_scalars(model_dir)
    if not series:
        print(f"error: no summaries in {args.model_dir}/tensorboard yet.", file=sys.stderr)
        return 2
    rows = summary_rows(series)
    width = max(len(what) for what, _ in rows)
    print(f"Run {model_dir}")
    for what, value in rows:
        print(f"  {what:<{width}}  {value}")
    for path in plot(series, args.output_dir or os.path.join(model_dir, "report")):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
