"""What head a fine-tuning task needs: its number of labels and, for GPT-1's input
transformations, how the head combines the task's sequences.

Task modules (`tasks/bert.py`, `tasks/gpt.py`, or a user's own) register each task's head here
when they register the task; the run checks the model's head against it before any work
(`input_pipeline.check_num_labels`). Living in the library, the table lets that check run without
the library importing any task module.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Head:
    """`num_labels` outputs (1: regression); `combine` is GPT-1's framing of the inputs
    ("single", "sum_orderings" or "choices", `GPTClassifierModel.combine`), None for a task
    whose head is not GPT-1's."""

    num_labels: int
    combine: str | None = None


_HEADS: dict[str, Head] = {}


def register(task_name: str, num_labels: int, combine: str | None = None) -> None:
    """Record the head `task_name` needs; registering the same task again replaces it, as
    seqio's registry does when a module is reloaded."""
    _HEADS[task_name] = Head(num_labels, combine)


def head_of(task_name: str) -> Head | None:
    """The head `task_name` needs, or None for a task without a classification head."""
    return _HEADS.get(task_name)
