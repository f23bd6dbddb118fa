"""Metrics against hand-computed values (official definitions), postprocessors on edge cases."""

import math

import numpy as np
import pytest

from t5x_like import metrics, postprocessors

# A known confusion matrix: TP 6, TN 3, FP 1, FN 2.
TARGETS = [1] * 6 + [0] * 3 + [0] * 1 + [1] * 2
PREDICTIONS = [1] * 6 + [0] * 3 + [1] * 1 + [0] * 2


def test_matthews_corrcoef_on_known_confusion_matrix():
    # (6*3 - 1*2) / sqrt(7 * 8 * 4 * 5) = 16 / sqrt(1120)
    got = metrics.matthews_corrcoef(TARGETS, PREDICTIONS)["matthews_corrcoef"]
    assert got == pytest.approx(100 * 16 / math.sqrt(1120))
    assert metrics.matthews_corrcoef([1, 1, 0], [1, 1, 1])["matthews_corrcoef"] == 0.0


def test_f1_and_accuracy():
    got = metrics.f1_and_accuracy(TARGETS, PREDICTIONS)
    assert got["f1"] == pytest.approx(100 * 12 / 15)  # 2TP / (2TP + FP + FN)
    assert got["accuracy"] == pytest.approx(100 * 9 / 12)


def test_invalid_output_counts_wrong_everywhere():
    # One positive and one negative example, both answered with garbage.
    targets, predictions = [1, 0, 1, 0], [1, 0, metrics.INVALID, metrics.INVALID]
    assert metrics.accuracy(targets, predictions)["accuracy"] == 50.0
    # Scored as FN and FP: F1 = 2*1 / (2 + 1 + 1).
    assert metrics.f1(targets, predictions)["f1"] == pytest.approx(50.0)
    # TP 1, TN 1, FP 1, FN 1 -> MCC 0.
    assert metrics.matthews_corrcoef(targets, predictions)["matthews_corrcoef"] == 0.0


def test_mean_multiclass_f1():
    # Class 0: tp 2 fp 0 fn 1 -> 0.8; class 1: tp 1 fp 1 fn 0 -> 2/3; class 2: tp 0 -> 0.
    got = metrics.mean_multiclass_f1(3)([0, 0, 0, 1, 2], [0, 0, 1, 1, metrics.INVALID])
    assert got["mean_f1"] == pytest.approx(100 * (0.8 + 2 / 3 + 0) / 3)
    assert got["accuracy"] == pytest.approx(60.0)


def test_pearson_and_spearman():
    # Centred: x = (-1.5, -.5, .5, 1.5), y = (-1.5, .5, -.5, 1.5): r = 4 / 5.
    got = metrics.pearson_and_spearman([1, 2, 3, 4], [1, 3, 2, 4])
    assert got["pearson"] == pytest.approx(80.0)
    assert got["spearman"] == pytest.approx(80.0)
    assert metrics.pearson_and_spearman([1, 2, 3], [2, 4, 6])["pearson"] == pytest.approx(100.0)


def test_multirc_f1a_and_exact_match():
    targets = [{"value": v, "group": g} for v, g in [(1, 0), (0, 0), (1, 0), (0, 1), (1, 1)]]
    got = metrics.multirc_f1a_and_em(targets, [1, 0, 0, 0, 1])
    assert got["f1a"] == pytest.approx(80.0)  # TP 2, FP 0, FN 1
    assert got["exact_match"] == pytest.approx(50.0)  # question 1 all right, question 0 not


@pytest.mark.parametrize("text,normalized", [
    ("The Cat!", "cat"),
    ("an apple pie.", "apple pie"),
    ("Theory of a banana", "theory of banana"),  # articles only as whole words
    ("  New   York\tCity ", "new york city"),
    ("U.S.", "us"),
    ("¿Qué?", "¿qué"),  # only ASCII punctuation is removed, as in the official script
])
def test_squad_normalisation(text, normalized):
    assert metrics.normalize_answer(text) == normalized


def test_squad_em_and_f1_take_the_best_gold_answer():
    targets = [["the big red dog", "a dog"], ["Denver Broncos"], ["1990"]]
    predictions = ["red dog house", "denver broncos.", "in 1991"]
    got = metrics.squad(targets, predictions)
    assert got["em"] == pytest.approx(100 / 3)
    # Example 1: vs "big red dog" P = R = 2/3 -> 2/3; vs "dog": P 1/3, R 1 -> 0.5. Best 2/3.
    assert got["f1"] == pytest.approx(100 * (2 / 3 + 1 + 0) / 3)


def test_bleu_brevity_penalty_by_hand():
    # All n-gram precisions are 1; BP = exp(1 - r/c) with r = 7, c = 6.
    got = metrics.bleu(["the cat sat on the mat today"], ["the cat sat on the mat"])
    assert got["bleu"] == pytest.approx(100 * math.exp(1 - 7 / 6), abs=1e-2)
    # intl tokenisation splits punctuation off words, so this is a perfect match.
    assert metrics.bleu(["Hello, world!"], ["Hello, world!"])["bleu"] == pytest.approx(100.0)


def test_rouge_by_hand():
    got = metrics.rouge(["the cat sat on the mat"], ["the cat sat"])
    assert got["rouge1"] == pytest.approx(100 * 2 * 1 * 0.5 / 1.5)  # P 3/3, R 3/6
    assert got["rouge2"] == pytest.approx(100 * 2 * 1 * 0.4 / 1.4)  # P 2/2, R 2/5
    assert metrics.rouge(["Cats were running."], ["cat was run"])["rouge1"] == pytest.approx(
        100 * 2 / 3)  # stemming: cats -> cat, running -> run; were/was differ


def test_postprocessors():
    labels = ("entailment", "neutral", "contradiction")
    assert postprocessors.string_label_to_class_id(b"neutral", labels) == 1
    assert postprocessors.string_label_to_class_id("Neutral", labels) == metrics.INVALID
    assert postprocessors.string_label_to_class_id("entailment entailment", labels) == -1
    assert postprocessors.string_to_float(b"3.8") == 3.8
    assert postprocessors.string_to_float("three") == -1.0
    example = {"idx_paragraph": np.int32(2), "idx_question": np.int32(3),
               "answers": [b"Denver", b"the Broncos"]}
    assert postprocessors.grouped_class_id("True", ("False", "True"),
                                           ("idx_paragraph", "idx_question"),
                                           example=example, is_target=True) == {
        "value": 1, "group": (2, 3)}
    assert postprocessors.answers_from_example(b"x", example=example, is_target=True) == [
        "Denver", "the Broncos"]
