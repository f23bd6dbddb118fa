"""BERT's pretraining examples: masking statistics and sentence pairs."""

import numpy as np
import pytest

from t5x_like.families.bert import pretraining_data as bert_data

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
VOCAB = 5000


def _sequence(rng, length):
    body = rng.integers(5, VOCAB, length).tolist()
    cut = int(rng.integers(1, length))
    return [CLS] + body[:cut] + [SEP] + body[cut:] + [SEP]


@pytest.mark.parametrize("max_len,max_predictions", [(128, 20), (512, 80)])
def test_masking_statistics(max_len, max_predictions):
    rng = np.random.default_rng(0)
    predicted = candidates = masked = randomised = kept = 0
    for _ in range(400):
        length = int(rng.integers(max_len // 4, max_len - 3))
        tokens = _sequence(rng, length)
        out, positions, labels = bert_data.mask_tokens(
            tokens, (CLS, SEP), MASK, VOCAB, max_predictions, rng
        )
        n = len(tokens)  # as the reference counts: [CLS] and [SEP] included
        assert len(positions) == min(max_predictions, max(1, round(0.15 * n)))
        assert all(tokens[p] not in (CLS, SEP) for p in positions)  # never specials
        assert labels == [tokens[p] for p in positions] and positions == sorted(positions)
        unchanged = [i for i in range(len(tokens)) if i not in set(positions)]
        assert all(out[i] == tokens[i] for i in unchanged)
        predicted += len(positions)
        candidates += n
        for p in positions:
            if out[p] == MASK:
                masked += 1
            elif out[p] == tokens[p]:
                kept += 1
            else:
                randomised += 1
    if max_len == 128:  # short sequences never reach the cap
        assert predicted / candidates == pytest.approx(0.15, abs=0.005)
    assert masked / predicted == pytest.approx(0.8, abs=0.02)
    assert randomised / predicted == pytest.approx(0.1, abs=0.015)
    assert kept / predicted == pytest.approx(0.1, abs=0.015)


def test_max_predictions_caps_long_sequences():
    rng = np.random.default_rng(1)
    tokens = _sequence(rng, 600)
    _, positions, _ = bert_data.mask_tokens(tokens, (CLS, SEP), MASK, VOCAB, 80, rng)
    assert len(positions) == 80  # 15% of 603 would be 90


def test_whole_word_masking_takes_every_piece_of_a_word():
    pieces = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        "un",
        "##aff",
        "##able",
        "runs",
        "the",
        "##s",
    ]
    tokens = [CLS] + [5, 6, 7, 8, 9, 10] * 20 + [SEP]
    rng = np.random.default_rng(2)
    for _ in range(50):
        _, positions, _ = bert_data.mask_tokens(
            tokens, (PAD, CLS, SEP), MASK, len(pieces), 20, rng, pieces=pieces, whole_word=True
        )
        chosen = set(positions)
        for p in positions:  # a chosen piece brings its whole word
            start = p
            while pieces[tokens[start]].startswith("##"):
                start -= 1
            end = p + 1
            while end < len(tokens) and pieces[tokens[end]].startswith("##"):
                end += 1
            assert set(range(start, end)) <= chosen


def _documents(rng, n_docs=60, sentences=(8, 30)):
    """Document d's tokens lie in [1000 d + 10, 1000 d + 999], so every token names its
    document."""
    return [
        [
            rng.integers(1000 * d + 10, 1000 * d + 999, int(rng.integers(6, 14))).tolist()
            for _ in range(int(rng.integers(*sentences)))
        ]
        for d in range(n_docs)
    ]


@pytest.mark.parametrize("skip_single", [False, True])
def test_sentence_pairs_are_random_or_next_and_never_from_the_same_document(skip_single):
    """A one-sentence chunk (here: a document's last sentence, now and then) is always
    NotNext, as in the reference (tests/test_reference_bert_pretraining.py); skipping such
    chunks (the option) leaves the paper's 50/50."""
    rng = np.random.default_rng(3)
    instances = []
    for _ in range(5):
        instances += bert_data.sentence_pair_instances(
            _documents(rng), 128, CLS, SEP, rng, skip_single_sentence_chunks=skip_single
        )
    assert len(instances) > 300
    random_share = np.mean([x.is_random_next for x in instances])
    if skip_single:
        assert random_share == pytest.approx(0.5, abs=0.05)
    else:
        assert random_share > 0.53
    for x in instances:
        assert len(x.tokens) <= 128 and x.tokens[0] == CLS and x.tokens.count(SEP) == 2
        first_sep = x.tokens.index(SEP)
        a, b = x.tokens[1:first_sep], x.tokens[first_sep + 1 : -1]
        assert a and b and x.segment_ids == [0] * (len(a) + 2) + [1] * (len(b) + 1)
        assert {t // 1000 for t in a} == {x.source_document}
        b_docs = {t // 1000 for t in b}
        if x.is_random_next:
            assert b_docs == {x.random_document} and x.random_document != x.source_document
        else:
            assert b_docs == {x.source_document}


def test_a_tenth_of_documents_use_a_shorter_target_length():
    """As in the reference, each document draws its target length once: the maximum, or with
    probability 0.1 a length uniform in [2, 509] (below 400 with probability 398/508)."""
    rng = np.random.default_rng(4)
    docs = _documents(rng, 600, sentences=(150, 200))  # ~1500-2800 tokens each
    instances = bert_data.sentence_pair_instances(docs, 512, CLS, SEP, rng)
    longest = {}
    for x in instances:
        longest[x.source_document] = max(longest.get(x.source_document, 0), len(x.tokens))
    short_docs = np.mean([v < 400 for v in longest.values()])
    assert short_docs == pytest.approx(0.1 * 398 / 508, abs=0.035)
    assert max(len(x.tokens) for x in instances) == 512
