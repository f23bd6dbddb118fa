"""Turn decoded text back into what a metric scores (seqio `postprocess_fn`s).

seqio calls `fn(text, example=..., is_target=...)` for both the model's output and the
target; both go through the same function, so a target and a correct prediction are equal.
Anything that is not a valid label becomes `metrics.INVALID`, which every metric counts wrong.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from t5x_like.metrics import INVALID


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def string_label_to_class_id(text: Any, label_classes: Sequence[str],
                             example: Mapping[str, Any] | None = None,
                             is_target: bool = False) -> int:
    """'entailment' -> its index in `label_classes`; anything else -> INVALID."""
    del example, is_target
    try:
        return list(label_classes).index(_text(text).strip())
    except ValueError:
        return INVALID


def string_to_float(text: Any, example: Mapping[str, Any] | None = None,
                    is_target: bool = False, default: float = float(INVALID)) -> float:
    """STS-B's '3.8' -> 3.8; an unparseable output -> -1 (outside the 0-5 scale)."""
    del example, is_target
    try:
        return float(_text(text))
    except ValueError:
        return default


def grouped_class_id(text: Any, label_classes: Sequence[str], group_key: str,
                     example: Mapping[str, Any] | None = None, is_target: bool = False) -> Any:
    """MultiRC: a target also carries the id of its question, for per-question exact match."""
    value = string_label_to_class_id(text, label_classes)
    if not is_target:
        return value
    group = example[group_key]
    return {"value": value, "group": tuple(group.tolist()) if hasattr(group, "tolist")
            else group}


def answers_from_example(text: Any, answers_key: str = "answers",
                         example: Mapping[str, Any] | None = None,
                         is_target: bool = False) -> Any:
    """SQuAD / ReCoRD: score a prediction against every gold answer of its example."""
    if not is_target:
        return _text(text)
    answers = example[answers_key] if example is not None else [text]
    return [_text(a) for a in answers]


def decode_text(text: Any, example: Mapping[str, Any] | None = None,
                is_target: bool = False) -> str:
    del example, is_target
    return _text(text)
