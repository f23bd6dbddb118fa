"""Score a BERT fine-tuning head on a task's split with the task's own metrics.

Text-to-text models are scored on decoded text (`evaluation`); BERT's heads predict numbers
directly: a class id or a score per example (`predict`), or a tag per token. Examples come from
seqio unshuffled and unpacked; the last batch is padded to the batch size (so the jitted
function compiles once) and the padding dropped before scoring.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import jax
import numpy as np
import seqio


def _batches(ds, batch_size: int) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """(real rows, batch padded to batch_size by repeating its last row)."""
    for batch in ds.batch(batch_size).as_numpy_iterator():
        n = len(next(iter(batch.values())))
        if n < batch_size:
            batch = {
                k: np.concatenate([v, np.repeat(v[-1:], batch_size - n, axis=0)])
                for k, v in batch.items()
            }
        yield n, batch


def predictions_and_targets(
    model: Any,
    params: Any,
    task_name: str,
    split: str,
    feature_lengths: Mapping[str, int],
    batch_size: int,
    max_examples: int | None = None,
) -> tuple[list, list]:
    """Per example: (prediction, target). Tagging models give the tags of the scored tokens
    (each word's first piece) as lists."""
    ds = seqio.get_dataset(
        task_name,
        dict(feature_lengths),
        feature_converter=model.feature_converter(False),
        dataset_split=split,
        shuffle=False,
        num_epochs=1,
    )
    if max_examples:
        ds = ds.take(max_examples)
    ds = ds.map(lambda ex: {k: ex[k] for k in model.FEATURES if k in ex})
    predict = jax.jit(model.predict)
    predictions: list = []
    targets: list = []
    for n, batch in _batches(ds, batch_size):
        predicted = np.asarray(jax.device_get(predict(params, batch)))[:n]
        if "labels" in batch:  # a tag per token
            for p, t, w in zip(predicted, batch["labels"][:n], batch["label_weights"][:n]):
                scored = w > 0
                predictions.append(p[scored].tolist())
                targets.append(t[scored].tolist())
            continue
        labels = batch["label"][:n]
        if model.is_regression:
            predictions += predicted.astype(float).tolist()
            targets += labels.astype(float).tolist()
        else:
            predictions += predicted.astype(int).tolist()
            targets += labels.astype(int).tolist()
    return predictions, targets


def evaluate_task(
    model: Any,
    params: Any,
    task_name: str,
    split: str,
    feature_lengths: Mapping[str, int],
    batch_size: int,
    max_examples: int | None = None,
) -> dict[str, float]:
    """The task's metrics (e.g. accuracy, F1, MCC, Pearson/Spearman) on `split`, or the
    model's own evaluation where it has one (`Model.evaluate_task`: SQuAD's EM and F1 for a
    span model)."""
    own = model.evaluate_task(params, task_name, split, feature_lengths, batch_size, max_examples)
    if own is not None:
        return own
    task = seqio.get_mixture_or_task(task_name)
    predictions, targets = predictions_and_targets(
        model, params, task_name, split, feature_lengths, batch_size, max_examples
    )
    scores: dict[str, float] = {}
    if not targets:
        return scores
    for metric_fn in task.metric_fns:
        scores.update(metric_fn(targets, predictions))
    return scores
