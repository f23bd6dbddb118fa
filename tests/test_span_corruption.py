"""T5's span corruption against hand-computed lengths, the paper's example and invariants,
and function by function against the T5 library (t5 0.9.4 `t5.data.preprocessors`, run in its
own process: tests/oracles/t5_span_pieces.py): `random_spans_helper`, `random_spans_noise_mask`
under the same seeds, and the sentinel functions on the paper's example."""

import functools

import numpy as np
import pytest
import seqio
import tensorflow as tf

from t5x_like.families.t5 import preprocessors
from tests.oracle import run_oracle

HELPER_CASES = [
    (512, 0.15, 3.0),
    (128, 0.15, 3.0),
    (1024, 0.15, 3.0),
    (512, 0.5, 10.0),
    (64, 0.25, 5.0),
    (114, 0.15, 2.0),
]
COUNT_SEEDS = [(0, 1), (7, 3), (123, 456)]
OTHER_SETTINGS = [(2.0, 0.15), (5.0, 0.25), (10.0, 0.5)]
PAPER_WORDS = "Thank you for inviting me to your party last week .".split()
PAPER_NOISE = ("for", "inviting", "last")


def _count_seeds(seed):
    return [list(seed), [seed[1], seed[0]]]


@pytest.fixture(scope="module")
def reference():
    """The T5 library's helper lengths, noise masks and sentinel outputs for this module's
    cases, from one oracle run."""
    masks = [
        {
            "length": 568,
            "noise_density": 0.15,
            "mean_noise_span_length": 3.0,
            "seeds": _count_seeds(seed),
        }
        for seed in COUNT_SEEDS
    ]
    masks += [
        {
            "length": 200,
            "noise_density": density,
            "mean_noise_span_length": span,
            "seeds": [[1, 2], [3, 4]],
        }
        for span, density in OTHER_SETTINGS
    ]
    paper = {
        "tokens": [PAPER_WORDS.index(w) + 10 for w in PAPER_WORDS],
        "noise": [w in PAPER_NOISE for w in PAPER_WORDS],
        "vocab_size": 100,
    }
    return run_oracle(
        "t5_span_pieces", {"helper": HELPER_CASES, "masks": masks, "sentinels": [paper]}
    )


@pytest.mark.parametrize(
    "inputs_length,expected",
    [
        (512, (568, 114)),  # the paper's setting: 568 raw tokens -> 512 inputs / 114 targets
        (128, (141, 29)),  # 141: 21 noise, 120 kept, 7 spans -> 120+7+1 = 128; 21+7+1 = 29
        (1024, (1137, 229)),  # 171 noise, 966 kept, 57 spans -> 1024 and 171+57+1
    ],
)
def test_length_arithmetic(inputs_length, expected):
    assert preprocessors.random_spans_helper(inputs_length) == expected


def test_length_arithmetic_equals_the_t5_library(reference):
    for (n, density, span), want in zip(HELPER_CASES, reference["helper"]):
        assert list(preprocessors.random_spans_helper(n, density, span)) == want, (n, density)


def _runs(mask: np.ndarray) -> int:
    return int(np.sum(mask[1:] & ~mask[:-1]) + mask[0])


@pytest.mark.parametrize("index,seed", list(enumerate(COUNT_SEEDS)))
def test_noise_mask_counts(index, seed, reference):
    seeds = tf.constant(_count_seeds(seed), tf.int32)
    mask = preprocessors.random_spans_noise_mask(tf.constant(568), 0.15, seeds, 3.0).numpy()
    assert mask.tolist() == reference["masks"][index]  # the library's mask, same seeds
    assert mask.shape == (568,)
    assert mask.sum() == 85  # round(568 * 0.15)
    assert _runs(mask) == 28  # round(85 / 3)
    assert not mask[0] and mask[-1]  # spans alternate, starting with kept tokens
    # Different seeds give different masks.
    other = preprocessors.random_spans_noise_mask(
        tf.constant(568), 0.15, tf.constant([[9, 9], [8, 8]], tf.int32), 3.0
    ).numpy()
    assert not np.array_equal(mask, other)


@pytest.mark.parametrize(
    "index,mean_span,density", [(i, *setting) for i, setting in enumerate(OTHER_SETTINGS)]
)
def test_noise_mask_other_settings(index, mean_span, density, reference):
    seeds = tf.constant([[1, 2], [3, 4]], tf.int32)
    mask = preprocessors.random_spans_noise_mask(
        tf.constant(200), density, seeds, mean_span
    ).numpy()
    assert mask.tolist() == reference["masks"][len(COUNT_SEEDS) + index]
    assert mask.sum() == round(200 * density)
    assert _runs(mask) == max(1, round(round(200 * density) / mean_span))


def test_papers_example(reference):
    """'Thank you <X> me to your party <Y> week .' -> '<X> for inviting <Y> last <Z>'
    (the paper's Figure 2)."""
    words = PAPER_WORDS
    vocab = seqio.PassThroughVocabulary(size=100)
    ids = {w: i + 10 for i, w in enumerate(words)}
    tokens = tf.constant([ids[w] for w in words])
    noise = tf.constant([w in PAPER_NOISE for w in words])
    inputs = preprocessors.noise_span_to_unique_sentinel(tokens, noise, vocab).numpy()
    targets = preprocessors.nonnoise_span_to_unique_sentinel(tokens, noise, vocab).numpy()
    x, y, z = 99, 98, 97  # sentinels count down from the top of the vocabulary
    assert inputs.tolist() == [
        ids["Thank"],
        ids["you"],
        x,
        ids["me"],
        ids["to"],
        ids["your"],
        ids["party"],
        y,
        ids["week"],
        ids["."],
    ]
    assert targets.tolist() == [x, ids["for"], ids["inviting"], y, ids["last"], z]
    [theirs] = reference["sentinels"]
    assert (inputs.tolist(), targets.tolist()) == (theirs["inputs"], theirs["targets"])


def _reconstruct(inputs, targets, first_sentinel):
    """Put each target span back in place of its sentinel in the inputs."""
    spans, current = {}, None
    for t in targets:
        if t > first_sentinel - 200:
            current = t
            spans[current] = []
        else:
            spans[current].append(t)
    out = []
    for t in inputs:
        out.extend(spans.get(t, [t]) if t > first_sentinel - 200 else [t])
    return out


def test_denoise_round_trip_and_sentinel_order():
    vocab = seqio.PassThroughVocabulary(size=1000)
    features = {"targets": seqio.Feature(vocab), "inputs": seqio.Feature(vocab)}
    tokens = np.arange(3, 3 + 568, dtype=np.int32) % 700 + 3
    ds = tf.data.Dataset.from_tensors({"targets": tf.constant(tokens)})
    with seqio.utils.map_seed_manager(42):
        ds = preprocessors.denoise(
            ds,
            features,
            0.15,
            noise_mask_fn=functools.partial(
                preprocessors.random_spans_noise_mask, mean_noise_span_length=3.0
            ),
            inputs_fn=preprocessors.noise_span_to_unique_sentinel,
            targets_fn=preprocessors.nonnoise_span_to_unique_sentinel,
        )
    ex = next(ds.as_numpy_iterator())
    assert len(ex["inputs"]) == 511 and len(ex["targets"]) == 113  # EOS is added later
    sentinels_in = [t for t in ex["inputs"] if t >= 900]
    assert sentinels_in == list(range(999, 999 - 28, -1))
    sentinels_out = [t for t in ex["targets"] if t >= 900]
    assert sentinels_out == sentinels_in
    assert _reconstruct(ex["inputs"].tolist(), ex["targets"].tolist(), 999) == tokens.tolist()


def test_span_corruption_pipeline_lengths():
    vocab = seqio.PassThroughVocabulary(size=1000)
    features = {"targets": seqio.Feature(vocab), "inputs": seqio.Feature(vocab)}
    docs = [np.arange(3, 3 + n, dtype=np.int32) % 800 + 3 for n in (2000, 300, 900)]
    ds = tf.data.Dataset.from_generator(
        lambda: ({"targets": d} for d in docs),
        output_signature={"targets": tf.TensorSpec([None], tf.int32)},
    )
    with seqio.utils.map_seed_manager(0):
        out = list(
            preprocessors.span_corruption(
                ds, {"inputs": 512, "targets": 114}, features
            ).as_numpy_iterator()
        )
    total = sum(len(d) for d in docs)
    assert len(out) == -(-total // 568)
    for ex in out[:-1]:  # every full chunk of 568 tokens: 511 + EOS = 512, 113 + EOS = 114
        assert len(ex["inputs"]) == 511 and len(ex["targets"]) == 113
    with pytest.raises(ValueError, match="at least 114"):
        preprocessors.span_corruption(ds, {"inputs": 512, "targets": 100}, features)
