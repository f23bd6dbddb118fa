"""BERT's SQuAD span decoder on hand-made logits."""

import numpy as np

from t5x_like import squad_spans


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
    assert [(w.start, w.length) for w in windows] == [(0, 128), (64, 128), (128, 128),
                                                     (192, 108)]
    # Token 100: window 0 gives it context min(100, 27) = 27, window 1 min(36, 91) = 36.
    assert squad_spans.is_max_context(windows, 1, 100)
    assert not squad_spans.is_max_context(windows, 0, 100)
    assert squad_spans.doc_stride_windows(50, 128, 64) == [squad_spans.Window(0, 50)]
