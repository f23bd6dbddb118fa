"""Evaluation metrics with the official definitions the T5 paper reports, as seqio metric
functions: `fn(targets, predictions) -> {name: value}`, values in percent like the paper.

Predictions arrive already postprocessed (`t5x_like.postprocessors`): a classification output
that was not a valid label is `INVALID` (-1) and always counts as wrong, also in F1 and MCC
(where it is scored as the opposite of the true label).
"""

from __future__ import annotations

import collections
import re
import string
from typing import Any, Mapping, Sequence

import numpy as np
import scipy.stats

INVALID = -1


# ----------------------------------------------------------------------- classification
def _binary(targets: Sequence[int], predictions: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(targets, dtype=np.int64)
    p = np.asarray(predictions, dtype=np.int64)
    return t, np.where(p == INVALID, 1 - t, p)


def accuracy(targets: Sequence[Any], predictions: Sequence[Any]) -> dict[str, float]:
    return {"accuracy": 100.0 * float(np.mean([t == p for t, p in zip(targets, predictions)]))}


def _f1_from_counts(tp: float, fp: float, fn: float) -> float:
    return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)


def f1(targets: Sequence[int], predictions: Sequence[int]) -> dict[str, float]:
    """F1 of the positive class (label 1), as GLUE reports for MRPC and QQP."""
    t, p = _binary(targets, predictions)
    tp, fp, fn = np.sum((p == 1) & (t == 1)), np.sum((p == 1) & (t == 0)), np.sum((p == 0) & (t == 1))
    return {"f1": 100.0 * _f1_from_counts(tp, fp, fn)}


def f1_and_accuracy(targets: Sequence[int], predictions: Sequence[int]) -> dict[str, float]:
    return {**f1(targets, predictions), **accuracy(targets, predictions)}


def matthews_corrcoef(targets: Sequence[int], predictions: Sequence[int]) -> dict[str, float]:
    """MCC of a binary task (CoLA): (TP·TN − FP·FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)),
    0 when a marginal is empty."""
    t, p = _binary(targets, predictions)
    tp = float(np.sum((p == 1) & (t == 1)))
    tn = float(np.sum((p == 0) & (t == 0)))
    fp = float(np.sum((p == 1) & (t == 0)))
    fn = float(np.sum((p == 0) & (t == 1)))
    denominator = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return {"matthews_corrcoef": 100.0 * ((tp * tn - fp * fn) / denominator if denominator else 0.0)}


def mean_multiclass_f1(num_classes: int):
    """Macro-averaged F1 over `num_classes` labels (SuperGLUE's CB), plus accuracy."""

    def metric(targets: Sequence[int], predictions: Sequence[int]) -> dict[str, float]:
        t, p = np.asarray(targets), np.asarray(predictions)
        scores = [_f1_from_counts(np.sum((p == c) & (t == c)), np.sum((p == c) & (t != c)),
                                  np.sum((p != c) & (t == c))) for c in range(num_classes)]
        return {"mean_f1": 100.0 * float(np.mean(scores)), **accuracy(targets, predictions)}

    metric.__name__ = f"mean_{num_classes}class_f1"
    return metric


# ----------------------------------------------------------------------- regression
def pearson_and_spearman(targets: Sequence[float],
                         predictions: Sequence[float]) -> dict[str, float]:
    """STS-B's correlations; an unparseable output (INVALID) stays in as -1, a wrong score."""
    t, p = np.asarray(targets, float), np.asarray(predictions, float)
    return {"pearson": 100.0 * float(scipy.stats.pearsonr(t, p)[0]),
            "spearman": 100.0 * float(scipy.stats.spearmanr(t, p)[0])}


# ----------------------------------------------------------------------- grouped answers
def multirc_f1a_and_em(targets: Sequence[Mapping[str, Any]],
                       predictions: Sequence[int]) -> dict[str, float]:
    """MultiRC: F1a is binary F1 over every answer option; EM is the share of questions whose
    options are all labelled right. Targets carry {'value': 0/1, 'group': question id}."""
    values = [t["value"] for t in targets]
    _, fixed = _binary(values, predictions)
    by_question: dict[Any, list[bool]] = collections.defaultdict(list)
    for target, prediction in zip(targets, fixed):
        by_question[target["group"]].append(int(prediction) == int(target["value"]))
    exact = np.mean([all(v) for v in by_question.values()])
    return {"f1a": f1(values, fixed)["f1"], "exact_match": 100.0 * float(exact)}


# ----------------------------------------------------------------------- SQuAD family
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's official normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _token_f1(target: str, prediction: str) -> float:
    truth, guess = normalize_answer(target).split(), normalize_answer(prediction).split()
    if not truth or not guess:  # SQuAD v2.0's rule for "no answer" on either side
        return float(truth == guess)
    common = collections.Counter(truth) & collections.Counter(guess)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(guess), same / len(truth)
    return 2 * precision * recall / (precision + recall)


def squad(targets: Sequence[Sequence[str]], predictions: Sequence[str]) -> dict[str, float]:
    """SQuAD EM and F1: each prediction scored against its best-matching gold answer. For
    v2.0, an unanswerable question has no gold answers and is right only when the prediction
    is empty ("no answer"), as the official v2.0 script scores it."""
    targets = [list(answers) or [""] for answers in targets]
    em = [max(float(normalize_answer(a) == normalize_answer(p)) for a in answers)
          for answers, p in zip(targets, predictions)]
    f1s = [max(_token_f1(a, p) for a in answers) for answers, p in zip(targets, predictions)]
    return {"em": 100.0 * float(np.mean(em)), "f1": 100.0 * float(np.mean(f1s))}


def record(targets: Sequence[Mapping[str, Any]], predictions: Sequence[str]) -> dict[str, float]:
    """ReCoRD: SQuAD's EM/F1, max over the gold answers, each query counted once (targets are
    {'answers': [...], 'query': id}; a query with several answers was several examples)."""
    seen: dict[Any, tuple[Sequence[str], str]] = {}
    for target, prediction in zip(targets, predictions):
        seen.setdefault(target["query"], (target["answers"], prediction))
    answers, guesses = zip(*seen.values()) if seen else ((), ())
    return squad(list(answers), list(guesses))


# ----------------------------------------------------------------------- generation
def bleu(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
    """Corpus BLEU from SacreBLEU with the paper's settings: exp smoothing, intl tokenisation."""
    import sacrebleu

    score = sacrebleu.corpus_bleu(list(predictions), [list(targets)], smooth_method="exp",
                                  tokenize="intl", lowercase=False, force=False,
                                  use_effective_order=False)
    return {"bleu": float(score.score)}


def rouge(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
    """ROUGE-1/2/Lsum F-measures (rouge-score, Porter stemming), averaged over examples.
    Sentences are split on newlines for ROUGE-Lsum, as CNN/DM summaries are written."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeLsum"], use_stemmer=True)
    totals: dict[str, float] = collections.defaultdict(float)
    for target, prediction in zip(targets, predictions):
        for name, score in scorer.score(target, prediction).items():
            totals[name] += score.fmeasure
    return {name: 100.0 * value / max(len(targets), 1) for name, value in totals.items()}


# ----------------------------------------------------------------------- tagging
def _entities(tags: Sequence[str]) -> set[tuple[int, int, str]]:
    """(start, end, type) chunks of an IOB tag sequence, as conlleval reads them: an entity
    starts at B-X, or at I-X that does not continue an X entity, and ends before the next
    tag that does not continue it."""
    chunks, start, kind = set(), None, None
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, _, tag_kind = tag.partition("-")
        continues = prefix == "I" and kind == tag_kind
        if start is not None and not continues:
            chunks.add((start, i, kind))
            start, kind = None, None
        if prefix in ("B", "I") and not continues:
            start, kind = i, tag_kind
    return chunks


def conll_ner_f1(tag_names: Sequence[str]):
    """Entity-level precision, recall and F1 (CoNLL-2003's official measure, in percent) over
    examples given as lists of tag ids, plus token accuracy."""

    def metric(targets: Sequence[Sequence[int]],
               predictions: Sequence[Sequence[int]]) -> dict[str, float]:
        found = correct = gold = 0
        right_tokens = total_tokens = 0
        for t, p in zip(targets, predictions):
            t_tags = [tag_names[i] for i in t]
            p_tags = [tag_names[i] if 0 <= i < len(tag_names) else "O" for i in p]
            true, guessed = _entities(t_tags), _entities(p_tags)
            gold, found, correct = gold + len(true), found + len(guessed), \
                correct + len(true & guessed)
            right_tokens += sum(a == b for a, b in zip(t, p))
            total_tokens += len(t)
        precision = correct / found if found else 0.0
        recall = correct / gold if gold else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return {"f1": 100.0 * f1, "precision": 100.0 * precision, "recall": 100.0 * recall,
                "token_accuracy": 100.0 * right_tokens / max(total_tokens, 1)}

    return metric
