"""Section 3.3's objectives reproduce the rows of the T5 paper's Table 3, and their random
choices have the paper's rates."""

import numpy as np
import pytest
import seqio
import tensorflow as tf

from t5x_like.families.t5 import objectives, preprocessors
from tests.word_vocab import WordVocabulary

SENTENCE = "Thank you for inviting me to your party last week ."
VOCAB = WordVocabulary(SENTENCE.split() + ["apple"] + [f"w{i}" for i in range(200)])
TOKENS = tf.constant(VOCAB.encode(SENTENCE), tf.int32)
# The corrupted words of Table 3: i.i.d. noise hits "for", "inviting" and "last"; the random
# spans example drops "for inviting me" and "your party last".
IID = tf.constant([w in ("for", "inviting", "last") for w in SENTENCE.split()])
SPANS = tf.constant([bool(b) for b in (0, 0, 1, 1, 1, 0, 1, 1, 1, 0, 0)])
SEEDS = tf.constant([[1, 2], [3, 4]])


def text(ids) -> str:
    """Token ids -> words, with the paper's names for sentinels (<X> <Y> <Z>) ..."""
    names = {"<extra_id_0>": "<X>", "<extra_id_1>": "<Y>", "<extra_id_2>": "<Z>"}
    pieces = VOCAB.pieces()
    return " ".join(names.get(pieces[i], pieces[i]) for i in np.asarray(ids).tolist() if i > 1)


def masked(ids) -> str:
    """... and <M> for the single mask token of the BERT/MASS rows."""
    return text(ids).replace("<X>", "<M>")


def test_prefix_lm_row():
    prefix = tf.range(11) < 4  # the split the row shows, as a prefix noise mask
    assert text(objectives.drop_nonnoise_tokens(TOKENS, prefix, VOCAB)) == (
        "Thank you for inviting"
    )
    assert text(objectives.drop_noise_tokens(TOKENS, prefix, VOCAB)) == (
        "me to your party last week ."
    )


def test_bert_style_row():
    # 90% of the noise tokens become the mask, 10% a random token; the row swaps "last" for
    # "apple". Targets are the original text.
    use_random = tf.constant([w == "last" for w in SENTENCE.split()])
    random_tokens = tf.fill(tf.shape(TOKENS), VOCAB.encode("apple")[0])
    inputs = objectives.replace_noise_tokens(
        TOKENS, IID, use_random, random_tokens, preprocessors.sentinel_id(VOCAB)
    )
    assert masked(inputs) == "Thank you <M> <M> me to your party apple week ."


def test_deshuffling_row():
    # The paper's shuffled example also shows a stray "fun" (not in the sentence); the input
    # here is a permutation of exactly the sentence's tokens, and the target is the sentence.
    inputs = objectives.permute_noise_tokens(TOKENS, tf.ones([11], tf.bool), VOCAB, SEEDS)
    assert sorted(text(inputs).split()) == sorted(SENTENCE.split())
    assert text(inputs) != SENTENCE
    order = [
        SENTENCE.split().index(w)
        for w in "party me for your to . last you inviting week Thank".split()
    ]
    assert text(tf.gather(TOKENS, order)) == "party me for your to . last you inviting week Thank"


def test_mass_style_row():
    inputs = objectives.noise_token_to_sentinel(TOKENS, IID, VOCAB)
    assert masked(inputs) == "Thank you <M> <M> me to your party <M> week ."


def test_iid_replace_spans_row():
    assert text(preprocessors.noise_span_to_unique_sentinel(TOKENS, IID, VOCAB)) == (
        "Thank you <X> me to your party <Y> week ."
    )
    assert text(preprocessors.nonnoise_span_to_unique_sentinel(TOKENS, IID, VOCAB)) == (
        "<X> for inviting <Y> last <Z>"
    )


def test_iid_drop_tokens_row():
    assert text(objectives.drop_noise_tokens(TOKENS, IID, VOCAB)) == (
        "Thank you me to your party week ."
    )
    assert text(objectives.drop_nonnoise_tokens(TOKENS, IID, VOCAB)) == "for inviting last"


def test_random_spans_row():
    assert text(preprocessors.noise_span_to_unique_sentinel(TOKENS, SPANS, VOCAB)) == (
        "Thank you <X> to <Y> week ."
    )
    assert text(preprocessors.nonnoise_span_to_unique_sentinel(TOKENS, SPANS, VOCAB)) == (
        "<X> for inviting me <Y> your party last <Z>"
    )


# --------------------------------------------------------------------------- rates
@pytest.mark.parametrize("density", [0.10, 0.15, 0.25, 0.50])
def test_iid_noise_rate(density):
    mask = objectives.iid_noise_mask(20000, density, tf.constant([[3, 4], [5, 6]])).numpy()
    assert abs(mask.mean() - density) < 0.01


def _runs(mask):
    padded = np.concatenate([[0], mask.astype(int), [0]])
    starts = np.flatnonzero(np.diff(padded) == 1)
    ends = np.flatnonzero(np.diff(padded) == -1)
    return ends - starts


@pytest.mark.parametrize("mean_span", [2, 3, 5, 10])
@pytest.mark.parametrize("density", [0.10, 0.15, 0.25, 0.50])
def test_random_spans_rate_and_mean_length(density, mean_span):
    mask = preprocessors.random_spans_noise_mask(
        10000, density, tf.constant([[7, 8], [9, 10]]), mean_noise_span_length=mean_span
    ).numpy()
    assert abs(mask.mean() - density) < 1e-3  # exactly round(n * density) noise tokens
    assert abs(_runs(mask).mean() - mean_span) < 0.05 * mean_span


def test_bert_style_masks_90_percent_and_swaps_10():
    tokens = tf.fill([20000], VOCAB.encode("apple")[0])
    noise = tf.ones([20000], tf.bool)
    mask_id = preprocessors.sentinel_id(VOCAB)
    for skip_sentinels in (False, True):
        out = objectives.noise_token_to_random_token_or_sentinel(
            tokens, noise, VOCAB, SEEDS, skip_sentinels=skip_sentinels
        ).numpy()
        # 20,000 draws at p = 0.9: the standard error is 0.0021, so 0.01 is ~4.7 of them.
        assert abs((out == mask_id).mean() - 0.9) < 0.01
        swapped = out[out != mask_id]
        # Random tokens: never pad/EOS/UNK; sentinels only as the reference draws them.
        assert swapped.min() >= objectives.FIRST_ORDINARY_ID
        top = VOCAB.vocab_size - (VOCAB.extra_ids if skip_sentinels else 0)
        assert swapped.max() < top and len(np.unique(swapped)) > 100
        assert (swapped >= VOCAB.vocab_size - VOCAB.extra_ids).any() != skip_sentinels


# --------------------------------------------------------------------------- pipelines
def _run(objective, density=0.15, mean_span=3.0, n_docs=20):
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(200)]
    docs = [" ".join(rng.choice(words, size=rng.integers(20, 120))) for _ in range(n_docs)]
    ds = tf.data.Dataset.from_tensor_slices({"targets": docs})
    ds = ds.map(lambda x: {"targets": VOCAB.encode_tf(x["targets"])})
    features = {"inputs": seqio.Feature(VOCAB), "targets": seqio.Feature(VOCAB)}
    with seqio.utils.map_seed_manager(42):
        out = objectives.unsupervised_objective(
            ds,
            {"inputs": 64, "targets": 64},
            features,
            objective=objective,
            noise_density=density,
            mean_noise_span_length=mean_span,
        )
    return list(out.as_numpy_iterator())


@pytest.mark.parametrize("objective", objectives.OBJECTIVES)
def test_every_objective_as_a_pipeline(objective):
    examples = _run(objective)
    assert examples
    raw = objectives.raw_tokens_per_example(objective, {"inputs": 64, "targets": 64}, 0.15, 3)
    sentinels = set(range(VOCAB.vocab_size - VOCAB.extra_ids, VOCAB.vocab_size))
    with_sentinels = 0
    for ex in examples:
        inputs, targets = list(ex["inputs"]), list(ex["targets"])
        assert 0 < len(inputs) <= 63
        if objective in ("bert_style", "mass_style", "deshuffling"):
            assert len(inputs) == len(targets) <= raw  # targets = the original text
        if objective == "deshuffling":
            assert sorted(inputs) == sorted(targets)
        if objective == "mass_style":
            assert all(i in (t, VOCAB.vocab_size - 1) for i, t in zip(inputs, targets))
        if objective == "iid_drop_tokens":
            assert not sentinels & set(inputs + targets)
        if objective in ("iid_replace_spans", "random_spans"):
            # Sentinels mark the same spans on both sides: in the targets they stand for the
            # kept runs, which number the noise runs -1, +0 or +1 (random spans always start
            # with kept text, so never -1; i.i.d. noise may start with a noise run).
            n_in, n_out = (sum(t in sentinels for t in x) for x in (inputs, targets))
            assert n_out - n_in in ((0, 1) if objective == "random_spans" else (-1, 0, 1))
            with_sentinels += n_in > 0
        if objective == "prefix_lm":
            assert len(inputs) + len(targets) <= raw and len(targets) <= 63
    if objective in ("iid_replace_spans", "random_spans"):
        # Only the short remainder of a document (a handful of tokens) can escape all noise.
        assert with_sentinels >= 0.8 * len(examples)


def test_unknown_objective_is_named():
    with pytest.raises(ValueError, match="Unknown objective 'bert'; choose one of"):
        _run("bert")


@pytest.mark.slow  # builds every objective's dataset (~60 s)
def test_every_offline_objective_task_yields_examples():
    """The registered tasks run end to end on the real offline corpus, each ending with EOS."""
    from t5x_like.tasks import offline

    assert len(offline.OFFLINE_TASKS) == 1 + 5 + 4 + 4
    vocab = offline.OfflineVocabulary()
    for name in offline.OFFLINE_TASKS:
        task = seqio.get_mixture_or_task(name)
        ds = task.get_dataset(
            {"inputs": 64, "targets": 64}, split="validation", shuffle=False, seed=0
        )
        examples = list(ds.take(3).as_numpy_iterator())
        assert len(examples) == 3, name
        for ex in examples:
            assert ex["inputs"][-1] == vocab.eos_id and ex["targets"][-1] == vocab.eos_id
            assert 2 < len(ex["inputs"]) <= 64 and 1 < len(ex["targets"]) <= 64


# --------------------------------------------------------------------------- targets length
@pytest.mark.parametrize(
    "objective,density,needed",
    [
        # targets = the original 511 tokens and EOS; the prefix LM's up to 510 and EOS (T5 library:
        # split_tokens_to_inputs_length, random_prefix_noise_mask); span corruption's 114
        # (random_spans_helper, the paper's 512/114).
        ("bert_style", 0.15, 512),
        ("mass_style", 0.15, 512),
        ("deshuffling", 1.0, 512),
        ("prefix_lm", 0.5, 511),
        ("random_spans", 0.15, 114),
    ],
)
def test_fixed_targets_lengths(objective, density, needed):
    assert objectives.targets_length_needed(objective, {"inputs": 512}, density, 3.0) == needed


def test_iid_targets_length_is_the_one_in_a_million_tail():
    """i.i.d. drop tokens at 15 % over 511 tokens: the targets hold Binomial(511, 0.15) tokens
    and EOS; the accepted length L is the smallest with P(Binomial > L - 1) <= 1e-6 (scipy)."""
    from scipy import stats

    length = objectives.targets_length_needed("iid_drop_tokens", {"inputs": 512}, 0.15, 3.0)
    assert stats.binom.sf(length - 1, 511, 0.15) <= 1e-6 < stats.binom.sf(length - 2, 511, 0.15)


def test_replace_spans_targets_distribution_by_enumeration():
    """The dynamic programme equals enumerating every mask of 12 tokens: the targets keep the
    noise tokens plus one sentinel per run of kept tokens (nonnoise_span_to_unique_sentinel)."""
    import itertools

    n, p = 12, 0.3
    exact = np.zeros(2 * n + 2)
    for bits in itertools.product([False, True], repeat=n):
        mask = tf.constant(bits)
        count = len(preprocessors.nonnoise_span_to_unique_sentinel(tf.range(3, 3 + n), mask, VOCAB))
        exact[count] += p ** sum(bits) * (1 - p) ** (n - sum(bits))
    np.testing.assert_allclose(
        objectives._replace_spans_targets_distribution(n, p), exact, atol=1e-12
    )


@pytest.mark.parametrize(
    "objective", ["bert_style", "prefix_lm", "iid_drop_tokens", "iid_replace_spans", "random_spans"]
)
def test_a_targets_length_that_would_cut_is_refused_with_the_one_that_fits(objective):
    needed = objectives.targets_length_needed(objective, {"inputs": 64}, 0.15, 3.0)
    features = {"inputs": seqio.Feature(VOCAB), "targets": seqio.Feature(VOCAB)}
    ds = tf.data.Dataset.from_tensor_slices({"targets": [[5, 6, 7]]})
    with pytest.raises(ValueError, match=f"at least {needed} "):
        objectives.unsupervised_objective(
            ds, {"inputs": 64, "targets": needed - 1}, features, objective=objective
        )
    objectives.unsupervised_objective(
        ds, {"inputs": 64, "targets": needed}, features, objective=objective
    )


def test_table2_lengths_fit_their_objectives():
    """The Table 2 data files give every row a targets length its objective fits."""
    import gin

    from t5x_like import config

    for data in ("c4", "offline"):
        gin.clear_config()
        gin.parse_config_file(f"gin_configs/table2/data/{data}.gin", skip_unknown=True)
        inputs = gin.query_parameter("%INPUTS_LENGTH")
        for objective, key in (
            ("iid_replace_spans", "%TARGETS_LENGTH"),
            ("prefix_lm", "%PREFIX_LM_TARGETS_LENGTH"),
        ):
            density = objectives.FIXED_NOISE_DENSITY.get(objective, 0.15)
            assert gin.query_parameter(key) >= objectives.targets_length_needed(
                objective, {"inputs": inputs}, density, 3.0
            ), (data, key)
    del config


def test_an_overflowing_example_is_cut_with_a_warning(capfd):
    ds = tf.data.Dataset.from_generator(
        lambda: ({"targets": t} for t in ([5, 6, 7, 8], [5, 6])),
        output_signature={"targets": tf.TensorSpec([None], tf.int32)},
    )
    out = list(
        objectives.warn_on_overflowing_targets(
            ds, {"targets": 4}, "iid_drop_tokens"
        ).as_numpy_iterator()
    )
    assert [x["targets"].tolist() for x in out] == [[5, 6, 7, 8], [5, 6]]  # cut later, by seqio
    err = capfd.readouterr().err
    assert err.count("overflow the targets length 4 by 1 tokens") == 1
