"""SQuAD span extraction for BERT (paper section 4.2 / 4.3), as the reference `run_squad.py`
decodes it.

* Long contexts are cut into windows of `max_tokens` with stride `doc_stride`; a token seen in
  several windows is scored only in the one where it has the most context
  (min(left, right) + 0.01 * window length).
* A span (i, j) scores start_logit[i] + end_logit[j]; it must lie in the context, have j >= i
  and at most `max_answer_length` tokens. The n best starts and ends are combined.
* SQuAD v2.0: the no-answer score is start_logit[CLS] + end_logit[CLS] (the smallest over the
  windows); the answer is "no answer" unless the best span beats it by more than `threshold`
  (tau, tuned on the dev set).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Window:
    start: int   # first context token of the window
    length: int


def doc_stride_windows(num_tokens: int, max_tokens: int, doc_stride: int) -> list[Window]:
    """Windows over `num_tokens` context tokens, each at most `max_tokens` long, starting every
    `doc_stride` tokens until one reaches the end."""
    windows, start = [], 0
    while True:
        length = min(max_tokens, num_tokens - start)
        windows.append(Window(start, length))
        if start + length >= num_tokens:
            return windows
        start += min(length, doc_stride)


def is_max_context(windows: Sequence[Window], index: int, position: int) -> bool:
    """Does window `index` give context token `position` its best context?"""
    best, best_index = None, None
    for w_index, w in enumerate(windows):
        if not w.start <= position < w.start + w.length:
            continue
        left, right = position - w.start, w.start + w.length - 1 - position
        score = min(left, right) + 0.01 * w.length
        if best is None or score > best:
            best, best_index = score, w_index
    return best_index == index


@dataclasses.dataclass(frozen=True)
class Span:
    window: int
    start: int   # token positions inside the window's feature
    end: int
    score: float


def best_spans(start_logits: np.ndarray, end_logits: np.ndarray, valid: np.ndarray,
               n_best: int = 20, max_answer_length: int = 30, window: int = 0) -> list[Span]:
    """Candidate spans of one feature, best first. `valid[i]` marks tokens that may start or
    end an answer (context tokens in their max-context window)."""
    starts = np.argsort(-start_logits)[:n_best]
    ends = np.argsort(-end_logits)[:n_best]
    spans = []
    for i in starts:
        for j in ends:
            if not (valid[i] and valid[j]) or j < i or j - i + 1 > max_answer_length:
                continue
            spans.append(Span(window, int(i), int(j),
                              float(start_logits[i] + end_logits[j])))
    return sorted(spans, key=lambda s: -s.score)[:n_best]


def predict(features: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
            n_best: int = 20, max_answer_length: int = 30, cls_index: int = 0,
            null_threshold: float | None = None) -> Span | None:
    """The answer span over all windows of an example (v1.1), or None for "no answer" when
    `null_threshold` (v2.0's tau) is given and the null score wins. Each feature is
    (start_logits, end_logits, valid)."""
    candidates: list[Span] = []
    null_score = np.inf
    for w, (start_logits, end_logits, valid) in enumerate(features):
        candidates += best_spans(start_logits, end_logits, valid, n_best, max_answer_length, w)
        null_score = min(null_score, float(start_logits[cls_index] + end_logits[cls_index]))
    best = max(candidates, key=lambda s: s.score, default=None)
    if null_threshold is not None and (best is None or
                                       null_score - best.score > null_threshold):
        return None
    return best
