"""Evaluation metrics of the T5 paper, computed as the T5 library computes them
(`t5.evaluation.metrics` and `t5.evaluation.qa_utils` of t5 0.9.4, the code behind the paper's
tables), as seqio metric functions: `fn(targets, predictions) -> {name: value}`, values in
percent, keys as the T5 library names them.

Where the T5 library calls a maintained library (scikit-learn, SciPy, SacreBLEU, rouge-score)
these functions call it the same way, with the same arguments, instead of re-implementing it;
`tests/test_reference_metrics.py` checks every task's postprocessor + metrics against the T5
library's on the same decoded text.

Predictions arrive already postprocessed (`t5x_like.families.t5.postprocessors`): a
classification output that is not a valid label is `INVALID` (-1). Each metric counts it as
the T5 library does: accuracy and macro-F1 as a wrong answer, binary F1 as the opposite of the
true label, and `matthews_corrcoef` as a class of its own (scikit-learn's multiclass MCC over
{-1, 0, 1}).
"""

from __future__ import annotations

import collections
import re
import string
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import scipy.stats

INVALID = -1

MetricFn = Callable[[Sequence[Any], Sequence[Any]], dict]


def _sklearn_metrics():
    """scikit-learn's metrics, imported on first use (like SacreBLEU and rouge-score
    below), so importing the task registry does not load it."""
    import sklearn.metrics

    return sklearn.metrics


# ----------------------------------------------------------------------- classification
def accuracy(targets: Sequence[Any], predictions: Sequence[Any]) -> dict[str, float]:
    """Share of exact matches (`sklearn.metrics.accuracy_score`, as t5's `accuracy`)."""
    return {"accuracy": 100 * _sklearn_metrics().accuracy_score(targets, predictions)}


def f1_score_with_invalid(targets: Sequence[int], predictions: Sequence[int]) -> dict[str, float]:
    """Binary F1 of label 1 (GLUE's MRPC/QQP); a prediction that is neither 0 nor 1 is
    replaced by the opposite of its target, so it is always wrong (t5's
    `f1_score_with_invalid`)."""
    targets, predictions = np.asarray(targets), np.array(predictions)
    invalid = np.logical_and(predictions != 0, predictions != 1)
    predictions[invalid] = 1 - targets[invalid]
    return {"f1": 100 * _sklearn_metrics().f1_score(targets, predictions)}


def f1_and_accuracy(targets: Sequence[int], predictions: Sequence[int]) -> dict[str, float]:
    """MRPC and QQP: t5 registers `[f1_score_with_invalid, accuracy]`."""
    return {**f1_score_with_invalid(targets, predictions), **accuracy(targets, predictions)}


def matthews_corrcoef(targets: Sequence[int], predictions: Sequence[int]) -> dict[str, float]:
    """CoLA: `sklearn.metrics.matthews_corrcoef` x 100 on the postprocessed labels, as t5's
    `sklearn_metrics_wrapper("matthews_corrcoef")`. An INVALID (-1) prediction stays -1, so
    with one present scikit-learn computes the multiclass MCC over {-1, 0, 1}."""
    return {"matthews_corrcoef": 100 * _sklearn_metrics().matthews_corrcoef(targets, predictions)}


def mean_multiclass_f1(num_classes: int) -> MetricFn:
    """SuperGLUE CB: macro F1 over the labels `range(num_classes)` (`sklearn.metrics.
    fbeta_score`, beta 1, as t5's `mean_multiclass_f1`; an INVALID prediction is a false
    negative of its true class), plus accuracy: t5 registers `[mean_multiclass_f1(3),
    accuracy]` for CB and this returns both, under t5's keys."""

    def metric(targets: Sequence[int], predictions: Sequence[int]) -> dict[str, float]:
        f1 = _sklearn_metrics().fbeta_score(
            targets, predictions, beta=1, labels=range(num_classes), average="macro"
        )
        return {f"mean_{num_classes}class_f1": 100 * f1, **accuracy(targets, predictions)}

    metric.__name__ = f"mean_{num_classes}class_f1"
    return metric


# ----------------------------------------------------------------------- regression
def pearson_corrcoef(targets: Sequence[float], predictions: Sequence[float]) -> dict[str, float]:
    """`scipy.stats.pearsonr` x 100 (t5's `pearson_corrcoef`): NaN when either side is
    constant, as SciPy defines it."""
    return {"pearson_corrcoef": 100 * scipy.stats.pearsonr(targets, predictions)[0]}


def spearman_corrcoef(targets: Sequence[float], predictions: Sequence[float]) -> dict[str, float]:
    """`scipy.stats.spearmanr` x 100 (t5's `spearman_corrcoef`)."""
    return {"spearman_corrcoef": 100 * scipy.stats.spearmanr(targets, predictions)[0]}


def pearson_and_spearman(
    targets: Sequence[float], predictions: Sequence[float]
) -> dict[str, float]:
    """STS-B: t5 registers `[pearson_corrcoef, spearman_corrcoef]`. An unparseable output
    was scored -1 by the postprocessor and stays in, a wrong score."""
    return {**pearson_corrcoef(targets, predictions), **spearman_corrcoef(targets, predictions)}


# ----------------------------------------------------------------------- grouped answers
def all_match(targets: Sequence[Any], predictions: Sequence[Any]) -> dict[str, float]:
    """100 when every prediction equals its target, else 0 (t5's `all_match`)."""
    return {"exact_match": 100 * float(np.array_equal(targets, predictions))}


def mean_group_metric(
    metric_fn: MetricFn, group_key: str = "group", value_key: str = "value"
) -> MetricFn:
    """`metric_fn` on the examples of each group (`target[group_key]`), averaged over the
    groups (t5's `mean_group_metric`: MultiRC's exact match is per question)."""

    def metric(
        targets: Sequence[Mapping[str, Any]], predictions: Sequence[Mapping[str, Any]]
    ) -> dict[str, float]:
        grouped: dict[Any, tuple[list, list]] = collections.defaultdict(lambda: ([], []))
        for target, prediction in zip(targets, predictions):
            group = grouped[target[group_key]]
            group[0].append(target[value_key])
            group[1].append(prediction[value_key])
        scores: dict[str, list[float]] = collections.defaultdict(list)
        for group_targets, group_predictions in grouped.values():
            for name, score in metric_fn(group_targets, group_predictions).items():
                scores[name].append(score)
        return {name: np.mean(values) for name, values in scores.items()}

    return metric


def deduplicate_metric(
    metric_fn: MetricFn, group_key: str = "group", value_key: str = "value"
) -> MetricFn:
    """`metric_fn` on the first example of each group only (t5's `deduplicate_metric`:
    ReCoRD trains on one example per gold answer but scores each query once)."""

    def metric(
        targets: Sequence[Mapping[str, Any]], predictions: Sequence[Mapping[str, Any]]
    ) -> dict[str, float]:
        seen, kept_targets, kept_predictions = set(), [], []
        for target, prediction in zip(targets, predictions):
            if target[group_key] in seen:
                continue
            seen.add(target[group_key])
            kept_targets.append(target[value_key])
            kept_predictions.append(prediction[value_key])
        return metric_fn(kept_targets, kept_predictions)

    return metric


def multirc_f1_over_all_answers(
    targets: Sequence[Mapping[str, Any]], predictions: Sequence[Mapping[str, Any]]
) -> dict[str, float]:
    """MultiRC's F1a: binary F1 over every answer option (`f1_score_with_invalid` on the
    "value"s, as t5's `multirc_f1_over_all_answers`)."""
    return f1_score_with_invalid([t["value"] for t in targets], [p["value"] for p in predictions])


def multirc_f1a_and_em(
    targets: Sequence[Mapping[str, Any]], predictions: Sequence[Mapping[str, Any]]
) -> dict[str, float]:
    """MultiRC: t5 registers `[multirc_f1_over_all_answers, mean_group_metric(all_match)]`:
    F1a as "f1" and the share of questions with every option right as "exact_match".
    Targets are {"value": 0/1, "group": question}, predictions {"value": label id}."""
    return {
        **multirc_f1_over_all_answers(targets, predictions),
        **mean_group_metric(all_match)(targets, predictions),
    }


# ----------------------------------------------------------------------- SQuAD family
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's official normalisation (t5's `qa_utils.normalize_squad`): lower case, ASCII
    punctuation removed, then the articles, then runs of whitespace made one space."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _token_f1(target: str, prediction: str) -> float:
    """Token F1 of two normalised answers; 0 when they share no token, also when both are
    empty (the official v1.1 script, t5's `qa_utils._f1_score`)."""
    common = collections.Counter(prediction.split()) & collections.Counter(target.split())
    same = sum(common.values())
    if same == 0:
        return 0
    precision, recall = same / len(prediction.split()), same / len(target.split())
    return 2 * precision * recall / (precision + recall)


def squad(targets: Sequence[Sequence[str]], predictions: Sequence[str]) -> dict[str, float]:
    """SQuAD v1.1 EM and F1, each prediction scored against its best gold answer (t5's
    `squad` / `qa_utils.qa_metrics`, which match the official v1.1 script). Every question
    needs a gold answer; `squad_v2` scores unanswerable questions."""
    if len(targets) != len(predictions):
        raise ValueError("Number of targets and predictions must match.")
    if any(len(answers) == 0 for answers in targets):
        raise ValueError(
            "SQuAD v1.1 needs a gold answer per question (an unanswerable "
            "question is scored by metrics.squad_v2)."
        )
    targets = [[normalize_answer(a) for a in answers] for answers in targets]
    predictions = [normalize_answer(p) for p in predictions]
    em = np.mean([max(a == p for a in answers) for answers, p in zip(targets, predictions)])
    f1 = np.mean(
        [max(_token_f1(a, p) for a in answers) for answers, p in zip(targets, predictions)]
    )
    return {"em": 100 * em, "f1": 100 * f1}


def _token_f1_v2(target: str, prediction: str) -> float:
    """The official v2.0 script's `compute_f1`: an empty answer on either side scores 1 if
    both are empty, else 0."""
    if not target.split() or not prediction.split():
        return float(target.split() == prediction.split())
    return float(_token_f1(target, prediction))


def squad_v2(targets: Sequence[Sequence[str]], predictions: Sequence[str]) -> dict[str, float]:
    """SQuAD v2.0 EM and F1 as the official v2.0 evaluation script computes them: gold
    answers that normalise to nothing are dropped, a question left without any is
    unanswerable (gold ""), right only for an empty prediction. (The T5 library has no v2.0
    metric; BERT's SQuAD 2.0 results use this script.)"""
    golds = [
        [normalize_answer(a) for a in answers if normalize_answer(a)] or [""] for answers in targets
    ]
    guesses = [normalize_answer(p) for p in predictions]
    em = [max(float(a == p) for a in answers) for answers, p in zip(golds, guesses)]
    f1 = [max(_token_f1_v2(a, p) for a in answers) for answers, p in zip(golds, guesses)]
    return {"em": 100.0 * float(np.mean(em)), "f1": 100.0 * float(np.mean(f1))}


def record(
    targets: Sequence[Mapping[str, Any]], predictions: Sequence[Mapping[str, Any]]
) -> dict[str, float]:
    """ReCoRD: SQuAD's EM/F1, max over the gold answers, each query counted once (t5's
    `deduplicate_metric(squad)`). Targets are {"value": [answers], "group": query},
    predictions {"value": answer}."""
    return deduplicate_metric(squad)(targets, predictions)


# ----------------------------------------------------------------------- generation
def bleu(
    targets: Sequence[Any], predictions: Sequence[str], tokenizer: str = "intl"
) -> dict[str, float]:
    """Corpus BLEU from SacreBLEU called as t5's `bleu` calls it: exp smoothing, `intl`
    tokenisation, case-sensitive. Targets are strings (one reference each) or lists of
    strings, which t5 hands to SacreBLEU as its reference streams."""
    import sacrebleu

    if isinstance(targets[0], list):
        targets = [list(target) for target in targets]
    else:
        targets = [targets]
    score = sacrebleu.corpus_bleu(
        predictions,
        targets,
        smooth_method="exp",
        smooth_value=0.0,
        force=False,
        lowercase=False,
        tokenize=tokenizer,
        use_effective_order=False,
    )
    return {"bleu": score.score}


def _prepare_summary(summary: str) -> str:
    """A newline after each " . " so ROUGE-Lsum sees the sentences (t5's `rouge`)."""
    return summary.replace(" . ", " .\n")


def rouge(
    targets: Sequence[str],
    predictions: Sequence[str],
    score_keys: Sequence[str] = ("rouge1", "rouge2", "rougeLsum"),
    **kwargs: Any,
) -> dict[str, float]:
    """ROUGE F-measures as t5's `rouge` computes them: rouge-score's `RougeScorer` with its
    defaults (no stemming; `kwargs`, e.g. `use_stemmer=True`, are passed to it as t5 passes
    them), summaries split into sentences at " . ", and the median ("mid") of a
    `BootstrapAggregator`'s 1,000 resampled means. The resampling draws from NumPy's global
    random state, as in t5: seed `np.random` for a reproducible number."""
    from rouge_score import rouge_scorer, scoring

    scorer = rouge_scorer.RougeScorer(rouge_types=score_keys, **kwargs)
    aggregator = scoring.BootstrapAggregator()
    for prediction, target in zip(predictions, targets):
        aggregator.add_scores(
            scorer.score(target=_prepare_summary(target), prediction=_prepare_summary(prediction))
        )
    result = aggregator.aggregate()
    return {key: result[key].mid.fmeasure * 100 for key in score_keys}


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

    def metric(
        targets: Sequence[Sequence[int]], predictions: Sequence[Sequence[int]]
    ) -> dict[str, float]:
        found = correct = gold = 0
        right_tokens = total_tokens = 0
        for t, p in zip(targets, predictions):
            t_tags = [tag_names[i] for i in t]
            p_tags = [tag_names[i] if 0 <= i < len(tag_names) else "O" for i in p]
            true, guessed = _entities(t_tags), _entities(p_tags)
            gold, found, correct = (
                gold + len(true),
                found + len(guessed),
                correct + len(true & guessed),
            )
            right_tokens += sum(a == b for a, b in zip(t, p))
            total_tokens += len(t)
        precision = correct / found if found else 0.0
        recall = correct / gold if gold else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return {
            "f1": 100.0 * f1,
            "precision": 100.0 * precision,
            "recall": 100.0 * recall,
            "token_accuracy": 100.0 * right_tokens / max(total_tokens, 1),
        }

    return metric
