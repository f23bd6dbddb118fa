"""SQuAD span extraction for BERT (paper section 4.2 / 4.3), as the reference `run_squad.py`
decodes it.

* Long contexts are cut into windows of `max_tokens` with stride `doc_stride`; a token seen in
  several windows is scored only in the one where it has the most context
  (min(left, right) + 0.01 * window length).
* A span (i, j) scores start_logit[i] + end_logit[j]; i must be a context token in its
  max-context window, j a context token of the same window, j >= i, and the span at most
  `max_answer_length` tokens. The n best starts and ends are combined.
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
    start: int  # first context token of the window
    length: int


def doc_stride_windows(num_tokens: int, max_tokens: int, doc_stride: int) -> list[Window]:
    """Windows over `num_tokens` context tokens, each at most `max_tokens` long, starting every
    `doc_stride` tokens until one reaches the end."""
    windows, start = [], 0
    while num_tokens > 0:  # an empty context has no window (the reference makes none)
        length = min(max_tokens, num_tokens - start)
        windows.append(Window(start, length))
        if start + length >= num_tokens:
            return windows
        start += min(length, doc_stride)
    return windows


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
    start: int  # token positions inside the window's feature
    end: int
    score: float


def best_spans(
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    valid: np.ndarray,
    n_best: int = 20,
    max_answer_length: int = 30,
    window: int = 0,
    in_context: np.ndarray | None = None,
) -> list[Span]:
    """Candidate spans of one feature, best first. `valid[i]` marks tokens that may start an
    answer (context tokens in their max-context window), `in_context[j]` those that may end
    one (any context token of the window; defaults to `valid`), as the reference checks."""
    in_context = valid if in_context is None else in_context
    starts = np.argsort(-start_logits)[:n_best]
    ends = np.argsort(-end_logits)[:n_best]
    spans = []
    for i in starts:
        for j in ends:
            if not (valid[i] and in_context[j]) or j < i or j - i + 1 > max_answer_length:
                continue
            spans.append(Span(window, int(i), int(j), float(start_logits[i] + end_logits[j])))
    return sorted(spans, key=lambda s: -s.score)[:n_best]


def best_and_null(
    features: Sequence[tuple[np.ndarray, ...]],
    n_best: int = 20,
    max_answer_length: int = 30,
    cls_index: int = 0,
) -> tuple[Span | None, float]:
    """The best span over all windows of an example and the null ("no answer") score, the
    smallest start_logit[CLS] + end_logit[CLS] over the windows. Each feature is
    (start_logits, end_logits, valid[, in_context])."""
    candidates: list[Span] = []
    null_score = np.inf
    for w, (start_logits, end_logits, valid, *rest) in enumerate(features):
        candidates += best_spans(
            start_logits, end_logits, valid, n_best, max_answer_length, w, rest[0] if rest else None
        )
        null_score = min(null_score, float(start_logits[cls_index] + end_logits[cls_index]))
    return max(candidates, key=lambda s: s.score, default=None), null_score


def predict(
    features: Sequence[tuple[np.ndarray, ...]],
    n_best: int = 20,
    max_answer_length: int = 30,
    cls_index: int = 0,
    null_threshold: float | None = None,
) -> Span | None:
    """The answer span over all windows of an example (v1.1), or None for "no answer" when
    `null_threshold` (v2.0's tau) is given and the null score beats the best span's by more
    than tau."""
    best, null_score = best_and_null(features, n_best, max_answer_length, cls_index)
    if null_threshold is not None and (best is None or null_score - best.score > null_threshold):
        return None
    return best


def best_null_threshold(
    score_diffs: Sequence[float], has_answer: Sequence[bool], span_scores: Sequence[float]
) -> tuple[float, float]:
    """Tune tau on a dev set as the paper does: (best threshold, the score it reaches in
    percent). `score_diffs[i]` is example i's null score minus its best span score (answer
    "no answer" when above tau); `has_answer[i]` whether it has gold answers; `span_scores[i]`
    the EM or F1 of its best span. The official v2.0 script's search: start from all-null and
    lower tau through the sorted differences (when all-null wins, tau is returned below every
    difference, so applying it reproduces the score; the official script says 0.0)."""
    n = len(score_diffs)
    score = float(sum(not a for a in has_answer))  # everything predicted null
    best_score, best_tau = score, min(score_diffs, default=0.0) - 1.0
    for i in sorted(range(n), key=lambda i: score_diffs[i]):
        # tau just below diff_i (at or above every earlier one): example i now answers
        score += span_scores[i] if has_answer[i] else -1.0
        if score > best_score:
            best_score, best_tau = score, score_diffs[i]
    return best_tau, 100.0 * best_score / max(n, 1)


# ------------------------------------------------------------------------------ features
def _is_whitespace(c: str) -> bool:
    return c in " \t\r\n" or ord(c) == 0x202F


def whitespace_words(context: str) -> tuple[list[str], list[int]]:
    """The context's whitespace-separated words and, for every character, the index of the
    word it belongs to (the reference's `doc_tokens` and `char_to_word_offset`)."""
    words: list[str] = []
    char_to_word: list[int] = []
    previous_space = True
    for c in context:
        if _is_whitespace(c):
            previous_space = True
        else:
            if previous_space:
                words.append(c)
            else:
                words[-1] += c
            previous_space = False
        char_to_word.append(len(words) - 1)
    return words, char_to_word


def answer_word_span(
    char_to_word: Sequence[int], answer_start: int, answer_text: str
) -> tuple[int, int]:
    """First and last word of an answer given by its character offset."""
    end_char = min(answer_start + len(answer_text) - 1, len(char_to_word) - 1)
    return char_to_word[answer_start], char_to_word[end_char]


def answer_recoverable(
    words: Sequence[str], answer_words: tuple[int, int], answer_text: str
) -> bool:
    """Whether the words an answer's offsets cover hold its text (whitespace-normalised), the
    reference's test before it trains on an example (run_squad.read_squad_examples)."""
    actual = " ".join(words[answer_words[0] : answer_words[1] + 1])
    return " ".join(answer_text.split()) in actual


def improve_answer_span(
    pieces: Sequence[int], start: int, end: int, answer_ids: Sequence[int]
) -> tuple[int, int]:
    """The narrowest pieces within [start, end] that are exactly the answer's own pieces
    (run_squad._improve_answer_span: "1895" in "(1895-1943)" is one piece, not the word),
    else [start, end]."""
    answer_ids = list(answer_ids)
    for new_start in range(start, end + 1):
        for new_end in range(end, new_start - 1, -1):
            if list(pieces[new_start : new_end + 1]) == answer_ids:
                return new_start, new_end
    return start, end


@dataclasses.dataclass
class Feature:
    """One window of an example: the model's inputs, the answer's token positions (0, 0 =
    [CLS] when the window lacks it or there is none), and what decoding needs: the word of
    each context token and which tokens may start or end an answer here."""

    input_ids: list[int]
    segment_ids: list[int]
    start_position: int
    end_position: int
    token_to_word: dict[int, int]
    valid: np.ndarray  # may start an answer: context tokens in their max-context window
    in_context: np.ndarray  # may end one: any context token


def featurize(
    query_ids: Sequence[int],
    word_pieces: Sequence[Sequence[int]],
    max_seq_length: int,
    doc_stride: int,
    cls_id: int,
    sep_id: int,
    answer_words: tuple[int, int] | None = None,
    max_query_length: int = 64,
    answer_ids: Sequence[int] | None = None,
) -> list[Feature]:
    """`[CLS] question [SEP] window [SEP]` for each document-stride window over the context's
    pieces (`word_pieces[w]` = the pieces of word w), as the reference's
    `convert_examples_to_features`; `answer_ids` (the answer text's pieces) narrow the
    answer's span to them (`improve_answer_span`)."""
    query = list(query_ids)[:max_query_length]
    pieces, piece_word = [], []
    for w, word in enumerate(word_pieces):
        for piece in word:
            pieces.append(piece)
            piece_word.append(w)
    answer_pieces = None
    if answer_words is not None:
        covered = [i for i, w in enumerate(piece_word) if answer_words[0] <= w <= answer_words[1]]
        if covered:
            answer_pieces = (covered[0], covered[-1])
            if answer_ids is not None:
                answer_pieces = improve_answer_span(pieces, *answer_pieces, answer_ids)
    windows = doc_stride_windows(len(pieces), max_seq_length - len(query) - 3, doc_stride)
    offset = len(query) + 2
    features = []
    for index, window in enumerate(windows):
        ids = (
            [cls_id]
            + query
            + [sep_id]
            + pieces[window.start : window.start + window.length]
            + [sep_id]
        )
        segments = [0] * offset + [1] * (window.length + 1)
        token_to_word, valid = {}, np.zeros(max_seq_length, bool)
        in_context = np.zeros(max_seq_length, bool)
        in_context[offset : offset + window.length] = True
        for i in range(window.length):
            token_to_word[offset + i] = piece_word[window.start + i]
            valid[offset + i] = is_max_context(windows, index, window.start + i)
        start = end = 0
        if (
            answer_pieces is not None
            and window.start <= answer_pieces[0]
            and answer_pieces[1] < window.start + window.length
        ):
            start = answer_pieces[0] - window.start + offset
            end = answer_pieces[1] - window.start + offset
        features.append(Feature(ids, segments, start, end, token_to_word, valid, in_context))
    return features


def span_text(words: Sequence[str], feature: Feature, span: Span) -> str:
    """The original context words a predicted span covers."""
    first, last = feature.token_to_word[span.start], feature.token_to_word[span.end]
    return " ".join(words[first : last + 1])


def piece_text(pieces: Sequence[str]) -> str:
    """WordPiece strings as text: '##' continuations joined to their word."""
    text = " ".join(pieces).replace(" ##", "").replace("##", "")
    return " ".join(text.split())


def _without_spaces(text: str) -> tuple[str, list[int]]:
    """The text without its spaces, and each kept character's index in the text."""
    kept = [i for i, c in enumerate(text) if c != " "]
    return "".join(text[i] for i in kept), kept


def final_text(predicted: str, original: str, basic_words: Sequence[str]) -> str:
    """The part of `original` (the context words a span covers) that the predicted pieces'
    text (`piece_text`) spells, as the reference's `get_final_text` finds it: the prediction
    is located in the basic-tokenized original (`basic_words`, lower-cased and split at
    punctuation), and mapped back character for character where the two agree once spaces
    are dropped, so "mat." becomes "mat" when the span ends before the period. Where the
    prediction is not found, or normalisation changed the characters (accents stripped),
    the whole original words."""
    tokenized = " ".join(basic_words)
    start = tokenized.find(predicted)
    if start < 0:
        return original
    end = start + len(predicted) - 1
    original_chars, original_index = _without_spaces(original)
    tokenized_chars, tokenized_index = _without_spaces(tokenized)
    if len(original_chars) != len(tokenized_chars):
        return original
    position = {index: n for n, index in enumerate(tokenized_index)}
    if start not in position or end not in position:
        return original
    return original[original_index[position[start]] : original_index[position[end]] + 1]
