"""SQuAD evaluation of a BERT span model: every document-stride window of every question is
scored, the windows' spans are combined as the reference does (`squad_spans.predict`: n-best
starts and ends, j >= i, max answer length, max-context windows, and for v2.0 the null score
against the threshold tau) and the answer text is scored with SQuAD's EM and F1.

The answer text is the part of the context's original words that the predicted pieces spell
(`answer_text`: the reference's `get_final_text`, so a span that ends before a word's period
leaves the period out), and "empty" where no span is valid, as the reference writes. v1.1 is
scored by
`metrics.squad` (the official v1.1 script, as the T5 library computes it), v2.0 by
`metrics.squad_v2` (the official v2.0 script: unanswerable questions, empty answers).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import gin
import jax
import numpy as np
import seqio
import tensorflow as tf

from t5x_like import metrics
from t5x_like.data.wordpiece import WordPieceVocabulary
from t5x_like.families.bert import preprocessors as bert_preprocessors
from t5x_like.families.bert import squad_spans


def best_answers(
    model: Any,
    params: Any,
    vocab: WordPieceVocabulary,
    examples: Iterable[Mapping[str, str]],
    max_seq_length: int,
    batch_size: int,
    doc_stride: int = 128,
    n_best: int = 20,
    max_answer_length: int = 30,
) -> list[tuple[str, float]]:
    """Per example: (the best span's text, null score - best span score). Examples carry
    `context` and `question`."""
    per_example: list[tuple[list[str], list[squad_spans.Feature]]] = []
    for ex in examples:
        per_example.append(
            bert_preprocessors.squad_features(
                vocab, ex["context"], ex["question"], None, max_seq_length, doc_stride
            )
        )
    flat = [f for _, features in per_example for f in features]
    predict = jax.jit(model.predict)
    starts, ends = [], []
    for i in range(0, len(flat), batch_size):
        chunk = flat[i : i + batch_size]
        ids = np.zeros((batch_size, max_seq_length), np.int32)
        segments = np.zeros_like(ids)
        for row, f in enumerate(chunk):
            ids[row, : len(f.input_ids)] = f.input_ids
            segments[row, : len(f.segment_ids)] = f.segment_ids
        batch = {"input_ids": ids, "segment_ids": segments, "input_mask": (ids != 0) * 1}
        start_logits, end_logits = jax.device_get(predict(params, batch))
        starts += list(np.asarray(start_logits)[: len(chunk)])
        ends += list(np.asarray(end_logits)[: len(chunk)])
    answers, k = [], 0
    for words, features in per_example:
        scored = [
            (starts[k + j], ends[k + j], f.valid, f.in_context) for j, f in enumerate(features)
        ]
        span, null_score = squad_spans.best_and_null(scored, n_best, max_answer_length)
        if span is None:  # no valid span: the reference's write_predictions says "empty"
            answers.append(("empty", np.inf))
        else:
            answers.append(
                (answer_text(vocab, words, features[span.window], span), null_score - span.score)
            )
        k += len(features)
    return answers


def answer_text(
    vocab: WordPieceVocabulary,
    words: list[str],
    feature: squad_spans.Feature,
    span: squad_spans.Span,
) -> str:
    """The text a span's pieces spell within the context's words (`squad_spans.final_text`)."""
    original = squad_spans.span_text(words, feature, span)
    pieces = vocab.pieces
    predicted = squad_spans.piece_text(
        [pieces[i] for i in feature.input_ids[span.start : span.end + 1]]
    )
    basic = vocab.tokenizer.basic_tokenize(tf.constant([original]))[0].numpy()
    return squad_spans.final_text(predicted, original, [w.decode("utf-8") for w in basic])


def predict_answers(
    model: Any,
    params: Any,
    vocab: WordPieceVocabulary,
    examples: Iterable[Mapping[str, str]],
    max_seq_length: int,
    batch_size: int,
    doc_stride: int = 128,
    n_best: int = 20,
    max_answer_length: int = 30,
    null_threshold: float | None = None,
) -> list[str]:
    """One answer per example; "" (no answer) where `null_threshold` (tau) is given and the
    null score beats the best span's by more than tau."""
    return [
        "" if null_threshold is not None and diff > null_threshold else text
        for text, diff in best_answers(
            model,
            params,
            vocab,
            examples,
            max_seq_length,
            batch_size,
            doc_stride,
            n_best,
            max_answer_length,
        )
    ]


@gin.configurable(
    "squad_evaluation", allowlist=["null_threshold", "doc_stride", "n_best", "max_answer_length"]
)
def evaluate_task(
    model: Any,
    params: Any,
    task_name: str,
    split: str,
    feature_lengths: Mapping[str, int],
    batch_size: int,
    max_examples: int | None = None,
    null_threshold: float = 0.0,
    doc_stride: int = 128,
    n_best: int = 20,
    max_answer_length: int = 30,
) -> dict[str, float]:
    """EM and F1 on the raw examples of a `bert_squad_*` task's split (settings from gin:
    `squad_evaluation.null_threshold=...`). For v2.0 (`*_v200`) answers are "no answer" when
    the null score wins by more than `null_threshold` (tau), and the tau that maximises F1
    on this split is reported too (`best_f1`, `best_f1_threshold`: the paper tunes tau on the
    dev set)."""
    task = seqio.get_mixture_or_task(task_name)
    raw = task.source.get_dataset(split, shuffle=False)
    if max_examples:
        raw = raw.take(max_examples)
    examples, gold = [], []
    for ex in raw.as_numpy_iterator():
        examples.append({"context": ex["context"].decode(), "question": ex["question"].decode()})
        gold.append([a.decode() for a in ex["answers"]["text"]])
    vocab = task.output_features["inputs"].vocabulary
    answers = best_answers(
        model,
        params,
        vocab,
        examples,
        feature_lengths["inputs"],
        batch_size,
        doc_stride,
        n_best,
        max_answer_length,
    )
    if not task_name.endswith("v200"):
        return metrics.squad(gold, [text for text, _ in answers])
    predictions = ["" if diff > null_threshold else text for text, diff in answers]
    scores = metrics.squad_v2(gold, predictions)
    span_f1 = [metrics.squad_v2([g], [text])["f1"] / 100.0 for g, (text, _) in zip(gold, answers)]
    tau, best_f1 = squad_spans.best_null_threshold(
        [d for _, d in answers], [bool(g) for g in gold], span_f1
    )
    return {**scores, "best_f1": best_f1, "best_f1_threshold": tau}
