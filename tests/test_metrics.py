"""Metrics and postprocessors where no oracle runs: our own inputs (bytes from numpy examples),
SQuAD v2.0 (the official v2.0 evaluation script's rules, which the T5 library does not
implement) and a refusal. Everything the T5 library computes is compared with it in
tests/test_reference_metrics.py."""

import numpy as np
import pytest

from t5x_like import metrics
from t5x_like.families.t5 import postprocessors


def test_postprocessors_read_bytes_as_the_text_seqio_would_pass():
    """Our evaluation passes a numpy example's `targets_pretokenized` (bytes); seqio passes
    it decoded. Both must give the same value."""
    labels = ("entailment", "neutral", "contradiction")
    for text in ("neutral", " neutral", "Neutral", ""):
        assert postprocessors.string_label_to_class_id(
            text.encode(), labels
        ) == postprocessors.string_label_to_class_id(text, labels)
    assert postprocessors.string_to_float(b"3.8") == postprocessors.string_to_float("3.8")
    example = {"idx_passage": np.int32(2), "idx_query": np.int32(3), "answers": [b"Denver"]}
    assert postprocessors.record_answers(
        b"x", example=example, is_target=True
    ) == postprocessors.record_answers("x", example=example, is_target=True)


def test_squad_v1_needs_a_gold_answer():
    with pytest.raises(ValueError, match="squad_v2"):
        metrics.squad([["x"], []], ["x", ""])


@pytest.mark.parametrize(
    "golds,prediction,em,f1",
    [
        # Unanswerable (no gold answer): right only when the prediction is empty, also for F1.
        ([], "", 1.0, 1.0),
        ([], "Denver", 0.0, 0.0),
        # Gold answers that normalise to nothing are dropped, so the question is unanswerable.
        (["the", "!"], "", 1.0, 1.0),
        # An empty prediction of an answerable question scores 0.
        (["Denver Broncos"], "", 0.0, 0.0),
        # Otherwise v1.1's token F1: vs "Denver Broncos" P 1, R 1/2.
        (["Denver Broncos"], "Denver", 0.0, 2 / 3),
    ],
)
def test_squad_v2_follows_the_official_v2_script(golds, prediction, em, f1):
    """SQuAD 2.0's evaluate-v2.0.py: `get_raw_scores` keeps the gold answers whose
    normalised text is non-empty, or [''] when none is; `compute_f1` scores an empty answer
    on either side as 1 when both are empty, else 0."""
    got = metrics.squad_v2([golds], [prediction])
    assert got["em"] == pytest.approx(100 * em)
    assert got["f1"] == pytest.approx(100 * f1)
