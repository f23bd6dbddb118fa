"""Decode a task's examples and score them with the task's own postprocessor and metrics.

Used three ways: periodic evaluation inside training, `python -m t5x_like.eval` and
`python -m t5x_like.infer`. Examples come from seqio unpacked and unshuffled; inputs are padded
to a fixed length so the jitted decoder compiles once; the last batch is padded with copies
and the copies dropped. Predictions are written as JSON lines.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import jax
import numpy as np
import seqio

from t5x_like import decoding, input_pipeline, logs, storage
from t5x_like.errors import ConfigError
from t5x_like.models.base import Model

PredictFn = Callable[[Any, dict[str, np.ndarray]], tuple[np.ndarray, np.ndarray]]


@dataclasses.dataclass
class Prediction:
    inputs: str
    prediction: str
    score: float
    target: str | None = None
    example: Mapping[str, Any] | None = None  # the raw seqio example (for postprocessing)

    def to_json(self) -> dict[str, Any]:
        record = {"inputs": self.inputs, "prediction": self.prediction, "score": self.score}
        if self.target is not None:
            record["target"] = self.target
        return record


def make_predict_fn(
    model: Model, max_decode_length: int, decode: decoding.DecodeConfig | None = None
) -> PredictFn:
    """A jitted (params, {'inputs': padded input ids, 'lengths': their lengths}) -> (tokens,
    scores) for any generating model: the ids go in as the model's `PROMPT_FEATURE` (a
    decoder-only model's prompt, with its lengths: in GPT-2's vocabulary the padding id 0 is
    also '!') or as T5's `encoder_input_tokens`."""
    feature = model.PROMPT_FEATURE

    def features(batch):
        if model.PROMPT_SHARES_SEQUENCE:
            return {feature: batch["inputs"], "prompt_lengths": batch["lengths"]}
        return {feature: batch["inputs"]}

    return jax.jit(
        lambda params, batch: model.predict_batch(
            params, features(batch), max_decode_length, return_scores=True, decode=decode
        )
    )


def until_eos(
    tokens: Sequence[int], eos_id: int | None = 1, vocabulary: seqio.Vocabulary | None = None
) -> list[int]:
    """The ids before the first EOS. In this codebase's vocabularies id 0 is padding: leading
    zeros are skipped and a later one ends the sequence; where `vocabulary` says it is a
    token (`ZERO_IS_A_TOKEN`, GPT-2's '!') it is kept."""
    zero_is_a_token = getattr(vocabulary, "ZERO_IS_A_TOKEN", False)
    out: list[int] = []
    for t in tokens:
        if eos_id is not None and t == eos_id:
            break
        if not zero_is_a_token and t == 0:
            if out:
                break
            continue
        out.append(int(t))
    return out


def _batches(
    examples: Iterable[dict[str, Any]], batch_size: int, inputs_length: int
) -> Iterator[tuple[list[dict[str, Any]], dict[str, np.ndarray]]]:
    """(examples, {'inputs': padded input ids, 'lengths'}) of up to `batch_size`; a short
    last batch is filled with copies of its last row so every call has the same shape."""
    chunk: list[dict[str, Any]] = []
    for ex in examples:
        chunk.append(ex)
        if len(chunk) == batch_size:
            yield chunk, _pad(chunk, batch_size, inputs_length)
            chunk = []
    if chunk:
        yield chunk, _pad(chunk, batch_size, inputs_length)


def _pad(chunk: list[dict[str, Any]], batch_size: int, length: int) -> dict[str, np.ndarray]:
    ids = np.zeros((batch_size, length), np.int32)
    lengths = np.zeros((batch_size,), np.int32)
    for i in range(batch_size):
        row = chunk[min(i, len(chunk) - 1)]["inputs"][:length]
        ids[i, : len(row)] = row
        lengths[i] = len(row)
    return {"inputs": ids, "lengths": lengths}


def task_examples(
    task_or_name: input_pipeline.TaskLike,
    split: str,
    feature_lengths: Mapping[str, int],
    max_examples: int | None = None,
) -> Iterator[dict[str, Any]]:
    """The task's preprocessed examples (tokenized, with `*_pretokenized` text), in order."""
    task = input_pipeline.resolve_task(task_or_name)
    input_pipeline.check_data_available(task, split)
    if split not in task.splits:
        raise ConfigError(f"Task {task.name!r} has no split {split!r}; it has {list(task.splits)}.")
    ds = task.get_dataset(dict(feature_lengths), split=split, shuffle=False, num_epochs=1, seed=0)
    if max_examples:
        ds = ds.take(max_examples)
    yield from ds.as_numpy_iterator()


def predict(
    predict_fn: PredictFn,
    params: Any,
    examples: Iterable[dict[str, Any]],
    vocabulary: seqio.Vocabulary,
    batch_size: int,
    inputs_length: int,
    progress: str | None = None,
    total: int | None = None,
    eos_id: int | None = 1,
) -> list[Prediction]:
    """Decode every example; text comes from `inputs_pretokenized` when present. Predictions
    end at `eos_id`, the model's (None: a model without one, e.g. GPT-1). With `progress`
    (the bar's name), a bar counts the examples decoded, with an ETA when `total` (the
    number of examples expected) is given."""
    out: list[Prediction] = []
    bar = logs.progress(desc=progress, total=total, unit="ex") if progress else None
    for chunk, batch in _batches(examples, batch_size, inputs_length):
        tokens, scores = jax.device_get(predict_fn(params, batch))
        if bar is not None:
            bar.update(len(chunk))
        for i, ex in enumerate(chunk):
            inputs = ex.get("inputs_pretokenized")
            target = ex.get("targets_pretokenized")
            out.append(
                Prediction(
                    inputs=inputs.decode()
                    if isinstance(inputs, bytes)
                    else vocabulary.decode(until_eos(ex["inputs"], eos_id, vocabulary)),
                    prediction=vocabulary.decode(until_eos(tokens[i], eos_id, vocabulary)),
                    score=float(scores[i]),
                    target=target.decode() if isinstance(target, bytes) else None,
                    example=ex,
                )
            )
    if bar is not None:
        bar.close()
    return out


def score(task: seqio.Task, predictions: Sequence[Prediction]) -> dict[str, float]:
    """The task's metrics on postprocessed targets and predictions."""
    if not task.metric_fns or not predictions:
        return {}
    post = task.postprocess_fn or (lambda text, example=None, is_target=False: text)
    targets = [
        post(p.example["targets_pretokenized"], example=p.example, is_target=True)
        for p in predictions
    ]
    guesses = [post(p.prediction, example=p.example, is_target=False) for p in predictions]
    results: dict[str, float] = {}
    for metric_fn in task.metric_fns:
        results.update({k: float(v) for k, v in metric_fn(targets, guesses).items()})
    return results


def evaluate_task(
    predict_fn: PredictFn,
    params: Any,
    task_or_name: input_pipeline.TaskLike,
    split: str,
    feature_lengths: Mapping[str, int],
    batch_size: int,
    max_examples: int | None = None,
    show_progress: bool = False,
    eos_id: int | None = 1,
) -> tuple[dict[str, float], list[Prediction]]:
    """The task's metrics and predictions (ending at the model's `eos_id`); `show_progress`
    draws a bar (off inside training, whose own bar is on screen)."""
    task = input_pipeline.resolve_task(task_or_name)
    vocabulary = task.output_features["targets"].vocabulary
    total = expected_examples(task, split, max_examples) if show_progress else None
    predictions = predict(
        predict_fn,
        params,
        task_examples(task, split, feature_lengths, max_examples),
        vocabulary,
        batch_size,
        feature_lengths["inputs"],
        progress=f"eval {task.name}" if show_progress else None,
        total=total,
        eos_id=eos_id,
    )
    return score(task, predictions), predictions


def expected_examples(task: seqio.Task, split: str, max_examples: int | None) -> int | None:
    """How many examples the split's source holds (capped at `max_examples`), for the ETA;
    None when the source does not say. A preprocessor that filters makes it an upper bound."""
    try:
        count = task.num_input_examples(split)
    except Exception:  # noqa: BLE001 - a source without counts only costs the ETA
        count = None
    if max_examples:
        return min(count, max_examples) if count else max_examples
    return count


def evaluable_tasks(
    task_or_mixture: input_pipeline.TaskLike, split: str = "validation"
) -> list[str]:
    """The names of the tasks (of a mixture, rate-0 evaluation-only members included) that
    have metrics and the split: the ones t5x's `seqio.Evaluator` scores (`seqio.get_subtasks`,
    then `seqio.evaluation.get_valid_eval_tasks`)."""
    provider = input_pipeline.resolve_task(task_or_mixture)
    scored = [t for t in seqio.get_subtasks(provider) if t.metric_fns]  # (never C4)
    for task in scored:
        try:
            task.splits  # noqa: B018 - an unprepared TFDS dataset has none
        except ValueError:
            input_pipeline.check_data_available(task, split)  # says how to prepare it
            raise
    return [t.name for t in seqio.evaluation.get_valid_eval_tasks(scored, split)]


def write_jsonl(path: str, records: Iterable[Mapping[str, Any]]) -> None:
    storage.write_text(
        storage.resolve(path),
        "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records),
    )
