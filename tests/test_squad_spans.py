"""BERT's SQuAD span decoder: on hand-made logits (each case's arithmetic stated), and
against Google BERT's `run_squad.py` (bert-tensorflow 1.0.4, run in its own process:
tests/oracles/bert_finetune.py) for the document-stride windows (`convert_examples_to_features`),
max context (`_check_is_max_context`) and the answer `write_predictions` picks from random
logits (v1.1, and v2.0 with its null score)."""

import numpy as np
import pytest

from t5x_like.data.wordpiece import WordPieceVocabulary
from t5x_like.families.bert import preprocessors as bert_preprocessors
from t5x_like.families.bert import squad_spans
from tests.oracle import run_oracle

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = [f"w{i}" for i in range(300)]  # one piece each
PUNCTUATION = [".", ",", "(", ")", "##s"]  # for the contexts whose words split into pieces
QUESTION = "w1"
# (context words, max_seq_length, doc_stride): the question is one piece, so each window
# holds max_seq_length - 1 - 3 context pieces
WINDOW_CASES = [(300, 132, 64), (50, 132, 64), (40, 16, 5), (33, 20, 12)]
# decoding: (context words, max_seq_length, doc_stride, n_best, max_answer_length, seed)
DECODE_CASES = [
    (60, 32, 9, 5, 30, 0),
    (60, 32, 9, 20, 30, 1),
    (45, 24, 7, 5, 4, 2),
    (80, 40, 16, 10, 8, 3),
]
# v1.1 (None), and v2.0 taus on both sides of these cases' null - best span (-4.7 to -6.8)
THRESHOLDS = (None, 0.0, -5.0, -6.5)


def _context(n):
    return " ".join(WORDS[:n])


def _example(n):
    return {
        "id": "q",
        "context": _context(n),
        "question": QUESTION,
        "answers": [],
        "is_impossible": False,
    }


def _squad_case(n, length, stride, predict=None):
    case = {
        "examples": [_example(n)],
        "is_training": False,
        "max_seq_length": length,
        "doc_stride": stride,
        "max_query_length": 64,
    }
    return {**case, "predict": predict} if predict else case


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(SPECIAL + WORDS + PUNCTUATION) + "\n")
    return WordPieceVocabulary(str(path))


PUNCTUATED_SEEDS = range(10, 22)


def _punctuated(seed):
    """A context whose words carry punctuation and '##s' (several pieces a word), so a
    predicted span can end inside a word."""
    rng = np.random.default_rng(seed)
    forms = ("{}", "{}.", "{},", "({})", "{}s", "({}s).")
    return " ".join(
        forms[rng.integers(len(forms))].format(WORDS[rng.integers(50)]) for _ in range(30)
    )


def _features(vocab, n, length, stride):
    return bert_preprocessors.squad_features(vocab, _context(n), QUESTION, None, length, stride)


def _random_logits(features, length, seed):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=length), rng.normal(size=length)) for _ in features]


@pytest.fixture(scope="module")
def reference(vocab, tmp_path_factory):
    """write_predictions on the same random logits we decode, and the reference's windows."""
    squad = [_squad_case(n, length, stride) for n, length, stride in WINDOW_CASES]
    for n, length, stride, n_best, max_len, seed in DECODE_CASES:
        _, features = _features(vocab, n, length, stride)
        logits = [[s.tolist(), e.tolist()] for s, e in _random_logits(features, length, seed)]
        for threshold in THRESHOLDS:
            squad.append(
                _squad_case(
                    n,
                    length,
                    stride,
                    {
                        "logits": logits,
                        "n_best": n_best,
                        "max_answer_length": max_len,
                        "null_threshold": threshold,
                    },
                )
            )
    windows = squad_spans.doc_stride_windows(300, 128, 64)
    for seed in PUNCTUATED_SEEDS:
        features = bert_preprocessors.squad_features(
            vocab, _punctuated(seed), QUESTION, None, 24, 8
        )[1]
        logits = [[s.tolist(), e.tolist()] for s, e in _random_logits(features, 24, seed)]
        squad.append(
            {
                "examples": [{**_example(0), "context": _punctuated(seed)}],
                "is_training": False,
                "max_seq_length": 24,
                "doc_stride": 8,
                "max_query_length": 64,
                "predict": {"logits": logits, "n_best": 20, "max_answer_length": 6},
            }
        )
    squad.append({**_squad_case(0, 24, 8), "examples": [{**_example(0), "context": "   "}]})
    payload = {
        "dir": str(tmp_path_factory.mktemp("bert_reference")),
        "vocab": SPECIAL + WORDS + PUNCTUATION,
        "squad": squad,
        "max_context": [{"spans": [[w.start, w.length] for w in windows], "num_tokens": 300}],
    }
    return run_oracle("bert_finetune", payload)


def _logits(n, peaks):
    x = np.full(n, -10.0)
    for pos, value in peaks.items():
        x[pos] = value
    return x


def test_end_before_start_is_never_chosen():
    # The best start (6) lies after the best end (3): the decoder must pair them validly.
    start = _logits(12, {6: 5.0, 2: 4.0})
    end = _logits(12, {3: 5.0, 8: 3.0})
    valid = np.ones(12, bool)
    valid[0] = False  # [CLS]
    best = squad_spans.predict([(start, end, valid)])
    # Candidates: (2,3) = 9, (6,8) = 8, (2,8) = 7 -> (2,3); never (6,3).
    assert (best.start, best.end, best.score) == (2, 3, 9.0)
    assert all(s.end >= s.start for s in squad_spans.best_spans(start, end, valid))


def test_maximum_answer_length():
    start = _logits(60, {5: 5.0, 20: 1.5})
    end = _logits(60, {40: 5.0, 25: 2.0})
    valid = np.ones(60, bool)
    best = squad_spans.predict([(start, end, valid)], max_answer_length=30)
    # (5, 40) scores 10 but is 36 tokens long: out. Then (5, 25) = 7 beats (20, 40) = 6.5
    # and (20, 25) = 3.5.
    assert (best.start, best.end, best.score) == (5, 25, 7.0)
    assert squad_spans.predict([(start, end, valid)], max_answer_length=40).end == 40


def test_tokens_outside_the_context_cannot_answer():
    start = _logits(10, {1: 9.0, 5: 1.0})
    end = _logits(10, {1: 9.0, 6: 1.0})
    valid = np.zeros(10, bool)
    valid[4:] = True  # tokens 0..3 are [CLS] and the question
    best = squad_spans.predict([(start, end, valid)])
    assert (best.start, best.end) == (5, 6)


def test_squad_v2_null_answer_with_threshold():
    start = _logits(10, {0: 3.0, 4: 2.0})
    end = _logits(10, {0: 3.0, 5: 2.5})
    valid = np.zeros(10, bool)
    valid[3:] = True
    features = [(start, end, valid)]
    # null = 6.0, best span = 4.5: the null answer wins unless tau allows the span.
    assert squad_spans.predict(features, null_threshold=0.0) is None
    assert squad_spans.predict(features, null_threshold=1.0) is None
    span = squad_spans.predict(features, null_threshold=1.6)
    assert (span.start, span.end) == (4, 5)
    assert squad_spans.predict(features).score == 4.5  # v1.1 always answers


def test_null_score_is_the_smallest_over_windows_and_best_span_the_largest():
    valid = np.ones(8, bool)
    valid[0] = False
    w0 = (_logits(8, {0: 4.0, 2: 1.0}), _logits(8, {0: 4.0, 3: 1.0}), valid)  # null 8, span 2
    w1 = (_logits(8, {0: 1.0, 5: 3.0}), _logits(8, {0: 1.0, 6: 3.0}), valid)  # null 2, span 6
    best = squad_spans.predict([w0, w1], null_threshold=0.0)
    assert (best.window, best.start, best.end) == (1, 5, 6)


def test_doc_stride_windows_and_max_context():
    windows = squad_spans.doc_stride_windows(300, 128, 64)
    assert [(w.start, w.length) for w in windows] == [(0, 128), (64, 128), (128, 128), (192, 108)]
    # Token 100: window 0 gives it context min(100, 27) = 27, window 1 min(36, 91) = 36.
    assert squad_spans.is_max_context(windows, 1, 100)
    assert not squad_spans.is_max_context(windows, 0, 100)
    assert squad_spans.doc_stride_windows(50, 128, 64) == [squad_spans.Window(0, 50)]


def test_windows_and_max_context_equal_the_reference(reference):
    for (n, length, stride), ref in zip(WINDOW_CASES, reference["squad"]):
        ours = squad_spans.doc_stride_windows(n, length - 1 - 3, stride)
        theirs = [sorted(f["token_to_orig_map"].values()) for f in ref["features"]]
        assert [list(range(w.start, w.start + w.length)) for w in ours] == theirs, n
    windows = squad_spans.doc_stride_windows(300, 128, 64)
    [flags] = reference["max_context"]
    assert [
        [squad_spans.is_max_context(windows, i, p) for p in range(300)] for i in range(len(windows))
    ] == flags


def test_decoding_random_logits_equals_write_predictions(vocab, reference):
    """Our n-best starts and ends, validity checks, length limit and v2.0 null decision pick
    the answer the reference picks, from the same logits (the n-best cut at 5 or 10 makes
    the question and padding positions compete, as they do in the reference)."""
    results = iter(reference["squad"][len(WINDOW_CASES) :])
    for n, length, stride, n_best, max_len, seed in DECODE_CASES:
        words, features = _features(vocab, n, length, stride)
        scored = [
            (s, e, f.valid, f.in_context)
            for (s, e), f in zip(_random_logits(features, length, seed), features)
        ]
        span, null_score = squad_spans.best_and_null(scored, n_best, max_len)
        text = squad_spans.span_text(words, features[span.window], span)
        for threshold in THRESHOLDS:
            ref = next(results)
            diff = null_score - span.score
            answer = "" if threshold is not None and diff > threshold else text
            assert answer == ref["predictions"]["q"], (n, seed, threshold)
            if threshold is not None:
                assert diff == pytest.approx(ref["scores_diff"]["q"], rel=1e-6)


def test_answer_text_equals_write_predictions_inside_words(vocab, reference):
    """Spans that start or end inside a word ("w3." -> "w3", "(w7s)." -> "w7s"): the answer is
    the part of the words the pieces spell, as the reference's get_final_text cuts it."""
    from t5x_like.families.bert import squad_eval

    results = reference["squad"][len(WINDOW_CASES) + len(DECODE_CASES) * len(THRESHOLDS) :]
    cut = 0
    for seed, ref in zip(PUNCTUATED_SEEDS, results):
        words, features = bert_preprocessors.squad_features(
            vocab, _punctuated(seed), QUESTION, None, 24, 8
        )
        scored = [
            (s, e, f.valid, f.in_context)
            for (s, e), f in zip(_random_logits(features, 24, seed), features)
        ]
        span, _ = squad_spans.best_and_null(scored, 20, 6)
        answer = squad_eval.answer_text(vocab, words, features[span.window], span)
        assert answer == ref["predictions"]["q"], seed
        cut += answer != squad_spans.span_text(words, features[span.window], span)
    assert cut  # some answers end inside a word: the cases test the cut


def test_an_empty_context_has_no_window(reference):
    """A whitespace-only context: no features, on both sides."""
    assert squad_spans.doc_stride_windows(0, 20, 8) == []
    assert reference["squad"][-1]["features"] == []
