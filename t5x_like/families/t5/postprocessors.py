"""Turn decoded text back into what a metric scores (seqio `postprocess_fn`s), value for value
as the T5 library's `t5.data.postprocessors` (t5 0.9.4) does.

seqio calls `fn(text, example=..., is_target=...)` for both the model's output and the
target; both go through the same function, so a target and a correct prediction are equal.
Anything that is not exactly a valid label becomes `metrics.INVALID` (-1), which each metric
counts as the T5 library does (see `t5x_like.metrics`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from t5x_like.metrics import INVALID


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def string_label_to_class_id(
    text: Any,
    label_classes: Sequence[str],
    example: Mapping[str, Any] | None = None,
    is_target: bool = False,
    default: int = INVALID,
) -> int:
    """'entailment' -> its index in `label_classes`; anything else, also the label with a
    space around it or in another case, -> `default` (t5's `string_label_to_class_id`)."""
    del example, is_target
    label = _text(text)
    return list(label_classes).index(label) if label in label_classes else default


def string_to_float(
    text: Any,
    example: Mapping[str, Any] | None = None,
    is_target: bool = False,
    default: float = float(INVALID),
) -> float:
    """STS-B's '3.8' -> 3.8; an unparseable output -> -1 (outside the 0-5 scale)."""
    del example, is_target
    try:
        return float(_text(text))
    except ValueError:
        return default


def grouped_class_id(
    text: Any,
    label_classes: Sequence[str],
    group_keys: Sequence[str],
    example: Mapping[str, Any] | None = None,
    is_target: bool = False,
) -> dict[str, Any]:
    """MultiRC (t5's `multirc`): {"value": label id}; a target also carries the id of its
    question as "group" (the value of the one key in `group_keys`, a tuple for several),
    for `metrics.mean_group_metric`'s per-question exact match. t5 groups by
    `idx/question` alone."""
    result: dict[str, Any] = {"value": string_label_to_class_id(text, label_classes)}
    if is_target:
        ids = tuple(int(example[k]) for k in group_keys)
        result["group"] = ids[0] if len(ids) == 1 else ids
    return result


def answers_from_example(
    text: Any,
    answers_key: str = "answers",
    example: Mapping[str, Any] | None = None,
    is_target: bool = False,
) -> Any:
    """SQuAD / ReCoRD: score a prediction against every gold answer of its example."""
    if not is_target:
        return _text(text)
    answers = example[answers_key] if example is not None else [text]
    return [_text(a) for a in answers]


def decode_text(
    text: Any, example: Mapping[str, Any] | None = None, is_target: bool = False
) -> str:
    del example, is_target
    return _text(text)


# Words that do not change which noun phrase a WSC prediction names (t5's list).
_DETERMINERS = frozenset(
    {
        "a",
        "an",
        "few",
        "her",
        "his",
        "each",
        "every",
        "many",
        "much",
        "my",
        "our",
        "some",
        "that",
        "the",
        "their",
        "these",
        "this",
        "those",
        "which",
        "whose",
        "your",
    }
)


def _without_determiners(text: str) -> str:
    """Lower-cased words without determiners, split at single spaces as t5's `clean` does
    (so a tab or a double space is kept inside the words)."""
    return " ".join(w for w in text.strip().lower().split(" ") if w not in _DETERMINERS)


def wsc_simple(text: Any, example: Mapping[str, Any] | None = None, is_target: bool = False) -> int:
    """WSC/DPR in the referent format (t5's `wsc_simple`): the target is the example's
    True/False label; a prediction counts as 'the candidate is the referent' (1) when its
    words, determiners aside, contain the candidate's or are contained in them (and both or
    neither are possessive). A prediction with no words left is INVALID (-1), so it never
    matches a False label by accident."""
    if is_target:
        return int(example["label"])
    prediction = _without_determiners(_text(text))
    if not prediction:
        return INVALID
    referent = _without_determiners(_text(example["targets_pretokenized"]))
    if ("'" in prediction) != ("'" in referent):
        return 0
    said, meant = set(prediction.split(" ")), set(referent.split(" "))
    return int(said <= meant or meant <= said)


def record_answers(
    text: Any, example: Mapping[str, Any] | None = None, is_target: bool = False
) -> dict[str, Any]:
    """ReCoRD (t5's `record`): a prediction is {"value": answer}; a target is {"value": every
    gold answer, "group": (passage, query)}, so `metrics.record` scores each query once
    although training made one example per answer."""
    if not is_target:
        return {"value": _text(text)}
    return {
        "value": [_text(a) for a in example["answers"]],
        "group": (int(example["idx_passage"]), int(example["idx_query"])),
    }
