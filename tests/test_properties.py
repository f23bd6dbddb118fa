"""Property tests (hypothesis) on random lengths, rates and seeds: every noising objective can be
undone where it should be, sentinels never collide with text ids, packing never lets one
example attend to another, and causal masks never show a token its future."""

from __future__ import annotations

import numpy as np
import pytest
import seqio
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from t5x_like.families.gpt import network as gpt_network
from t5x_like.families.t5 import network as t5
from t5x_like.families.t5 import objectives, preprocessors

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class _Vocabulary(seqio.PassThroughVocabulary):
    """Ids [0, size): the last `extra_ids` are sentinels, as in T5's SentencePiece vocabulary."""

    def __init__(self, size: int, extra_ids: int) -> None:
        super().__init__(size=size)
        self._extra = extra_ids

    @property
    def extra_ids(self) -> int:
        return self._extra


VOCAB = _Vocabulary(size=1000, extra_ids=100)  # vocab_size 1100: 1000 text ids + 100
TEXT_IDS = (objectives.FIRST_ORDINARY_ID, VOCAB.vocab_size - VOCAB.extra_ids)  # [low, high)
seeds_strategy = st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1))


def _tokens(length: int, seed: int) -> tf.Tensor:
    return tf.constant(np.random.default_rng(seed).integers(*TEXT_IDS, size=length), tf.int32)


def _is_sentinel(ids: np.ndarray) -> np.ndarray:
    return ids >= TEXT_IDS[1]


def _undo_unique_sentinels(inputs: np.ndarray, targets: np.ndarray) -> list[int]:
    """Put the noise spans of `targets` back where the sentinels stand in `inputs`. In the
    targets the sentinels stand for the kept runs, so the noise runs are what lies between
    them, in order."""
    runs, current = [], []
    for token in targets.tolist() + [TEXT_IDS[1]]:  # (a final sentinel closes the last run)
        if _is_sentinel(np.array(token)):
            if current:
                runs.append(current)
            current = []
        else:
            current.append(token)
    runs = iter(runs)
    out = []
    for token in inputs.tolist():
        out.extend(next(runs) if _is_sentinel(np.array(token)) else [token])
    return out


def _noise_runs(mask: np.ndarray) -> int:
    return int(np.sum(mask[1:] & ~mask[:-1]) + mask[0]) if mask.size else 0


@SETTINGS
@given(
    length=st.integers(2, 700),
    density=st.sampled_from([0.1, 0.15, 0.25, 0.5]),
    mean_span=st.floats(1.0, 10.0),
    seeds=st.lists(seeds_strategy, min_size=2, max_size=2),
    text_seed=st.integers(0, 2**31),
    iid=st.booleans(),
)
def test_span_corruption_inputs_and_targets_rebuild_the_text(
    length, density, mean_span, seeds, text_seed, iid
):
    tokens = _tokens(length, text_seed)
    seed_tensor = tf.constant(seeds, tf.int32)
    mask = (
        objectives.iid_noise_mask(tf.constant(length), density, seed_tensor)
        if iid
        else preprocessors.random_spans_noise_mask(
            tf.constant(length), density, seed_tensor, mean_span
        )
    )
    # With clip_to_sentinels (the option; the reference's count-down into text ids past the
    # extra ids is checked against the T5 library in test_reference_objectives.py).
    inputs = preprocessors.noise_span_to_unique_sentinel(
        tokens, mask, VOCAB, clip_to_sentinels=True
    ).numpy()
    targets = preprocessors.nonnoise_span_to_unique_sentinel(
        tokens, mask, VOCAB, clip_to_sentinels=True
    ).numpy()
    mask = mask.numpy()
    # Sentinels never take a text id, however many spans there are.
    for ids in (inputs, targets):
        assert ids.max() < VOCAB.vocab_size and ids.min() >= objectives.FIRST_ORDINARY_ID
    in_sentinels = inputs[_is_sentinel(inputs)]
    assert len(in_sentinels) == _noise_runs(mask)  # one sentinel per span
    if _noise_runs(mask) <= VOCAB.extra_ids and _noise_runs(~mask) <= VOCAB.extra_ids:
        assert len(set(in_sentinels.tolist())) == len(in_sentinels)  # unique per example
        assert _undo_unique_sentinels(inputs, targets) == tokens.numpy().tolist()
        if not mask[0]:  # text starts with kept tokens (always so for random spans): each
            # noise span follows, in the targets, the very sentinel that replaced it
            assert (
                targets[_is_sentinel(targets)][: len(in_sentinels)].tolist()
                == in_sentinels.tolist()
            )


@SETTINGS
@given(
    length=st.integers(2, 600),
    density=st.sampled_from([0.1, 0.15, 0.5]),
    seeds=st.lists(seeds_strategy, min_size=2, max_size=2),
    text_seed=st.integers(0, 2**31),
)
def test_token_level_objectives_keep_what_they_must(length, density, seeds, text_seed):
    tokens = _tokens(length, text_seed)
    original = tokens.numpy()
    seed_tensor = tf.constant(seeds, tf.int32)
    mask = objectives.iid_noise_mask(tf.constant(length), density, seed_tensor)
    kept = objectives.drop_noise_tokens(tokens, mask, VOCAB).numpy()
    dropped = objectives.drop_nonnoise_tokens(tokens, mask, VOCAB).numpy()
    rebuilt = np.empty(length, np.int32)
    rebuilt[~mask.numpy()], rebuilt[mask.numpy()] = kept, dropped
    np.testing.assert_array_equal(rebuilt, original)  # i.i.d. drop: inputs + targets = text
    shuffled = objectives.permute_noise_tokens(
        tokens, tf.ones_like(mask), VOCAB, seed_tensor
    ).numpy()
    np.testing.assert_array_equal(np.sort(shuffled), np.sort(original))  # deshuffling
    masked = objectives.noise_token_to_sentinel(tokens, mask, VOCAB).numpy()  # MASS-style
    np.testing.assert_array_equal(masked[~mask.numpy()], original[~mask.numpy()])
    assert (masked[mask.numpy()] == preprocessors.sentinel_id(VOCAB)).all()
    bert = objectives.noise_token_to_random_token_or_sentinel(
        tokens, mask, VOCAB, seed_tensor
    ).numpy()
    np.testing.assert_array_equal(bert[~mask.numpy()], original[~mask.numpy()])
    replaced = bert[mask.numpy()]
    # The reference's random tokens come from [3, vocab_size), sentinels included.
    assert ((replaced >= objectives.FIRST_ORDINARY_ID) & (replaced < VOCAB.vocab_size)).all()
    prefix = objectives.random_prefix_noise_mask(tf.constant(length), 0.5, seed_tensor)
    inputs = objectives.drop_nonnoise_tokens(tokens, prefix, VOCAB).numpy()
    targets = objectives.drop_noise_tokens(tokens, prefix, VOCAB).numpy()
    np.testing.assert_array_equal(np.concatenate([inputs, targets]), original)  # prefix LM
    assert 1 <= len(inputs) <= length - 1 and len(targets) >= 1


def test_real_vocabulary_text_never_takes_a_sentinel_id():
    from t5x_like.tasks.offline import OfflineVocabulary

    vocab = OfflineVocabulary()

    @SETTINGS
    @given(text=st.text(max_size=200))
    def check(text):
        ids = vocab.encode(text)
        assert all(i < vocab.vocab_size - vocab.extra_ids for i in ids)

    check()


def _examples(lengths, key_lengths):
    rng = np.random.default_rng(sum(map(sum, lengths)))
    rows = [
        {key: rng.integers(2, 50, size=n).astype(np.int32) for key, n in zip(key_lengths, sizes)}
        for sizes in lengths
    ]
    return tf.data.Dataset.from_generator(
        lambda: iter(rows),
        output_signature={k: tf.TensorSpec([None], tf.int32) for k in key_lengths},
    )


def _assert_only_own_segment(
    mask: np.ndarray, query_segments: np.ndarray, key_segments: np.ndarray
) -> None:
    """A real token (segment id > 0) attends to real tokens of its own example only. (Queries
    at padding positions are never read: their loss weight is zero.)"""
    allowed = (mask[:, 0] > 0) & (query_segments[:, :, None] > 0)
    same = (query_segments[:, :, None] == key_segments[:, None, :]) & (key_segments[:, None, :] > 0)
    assert not (allowed & ~same).any(), "a token attends outside its packed example"


example_lengths = st.lists(
    st.tuples(st.integers(1, 20), st.integers(1, 12)), min_size=1, max_size=8
)


@pytest.mark.slow  # 20 tf.data pipelines (~30 s; the default suite must stay under 15 minutes)
@SETTINGS
@given(lengths=example_lengths)
def test_packed_t5_batches_never_attend_across_examples_or_to_the_future(lengths):
    converter = seqio.EncDecFeatureConverter(pack=True)
    ds = converter(_examples(lengths, ("inputs", "targets")), {"inputs": 24, "targets": 16})
    for ex in ds.batch(len(lengths)).as_numpy_iterator():
        enc, dec = ex["encoder_segment_ids"], ex["decoder_segment_ids"]
        encoder = np.asarray(t5.encoder_self_mask(ex["encoder_input_tokens"], enc))
        _assert_only_own_segment(encoder, enc, enc)
        # Every real token does see all of its own example (packing loses nothing).
        assert (
            encoder[:, 0]
            == (
                (enc[:, :, None] == enc[:, None, :]) & (enc[:, :, None] > 0) & (enc[:, None, :] > 0)
            )
        ).all()
        decoder = np.asarray(t5.decoder_self_mask(ex["decoder_input_tokens"], dec))
        _assert_only_own_segment(decoder, dec, dec)
        assert not np.triu(decoder[:, 0] > 0, k=1).any(), "a decoder token sees its future"
        cross = np.asarray(
            t5.cross_attention_mask(
                ex["decoder_input_tokens"], ex["encoder_input_tokens"], dec, enc
            )
        )
        _assert_only_own_segment(cross, dec, enc)


@pytest.mark.slow  # 20 tf.data pipelines (~30 s; the default suite must stay under 15 minutes)
@SETTINGS
@given(lengths=example_lengths)
def test_packed_decoder_only_masks_hide_the_future_outside_the_prefix(lengths):
    converter = seqio.PrefixLMFeatureConverter(pack=True)
    ds = converter(_examples(lengths, ("inputs", "targets")), {"inputs": 24, "targets": 16})
    for ex in ds.batch(len(lengths)).as_numpy_iterator():
        segments, prefix = ex["decoder_segment_ids"], ex["decoder_causal_attention"] > 0
        for causal_attention in (None, ex["decoder_causal_attention"]):
            mask = np.asarray(
                gpt_network.decoder_mask(ex["decoder_input_tokens"], segments, causal_attention)
            )
            _assert_only_own_segment(mask, segments, segments)
            future = np.triu(mask[:, 0] > 0, k=1)
            if causal_attention is None:
                assert not future.any(), "causal mode: a token sees its future"
            else:  # only inputs see later inputs; no target is ever seen early
                assert not (future & ~(prefix[:, :, None] & prefix[:, None, :])).any()
