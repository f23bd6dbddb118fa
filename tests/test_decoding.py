"""Greedy, beam search and sampling: hand-set models with known answers, and the real T5 on
its key/value cache checked against teacher-forced scoring."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like import decoding
from t5x_like.families.t5 import network as t5
from t5x_like.families.t5.model import EncoderDecoderModel, shift_right

PAD, EOS, A, B = 0, 1, 2, 3
# A bigram language model with hand-set probabilities (rows: previous token, start = PAD).
# Greedy takes A (0.55) and then A again and again, never ending; the best sequence starts
# with the less likely B and ends at once (0.45 * 0.9 = 0.405); the second best is
# A B EOS (0.55 * 0.35 * 0.9 = 0.173), just ahead of A EOS (0.165).
BIGRAM = np.array(
    [
        [1e-9, 1e-9, 0.55, 0.45],  # after start
        [0.25, 0.25, 0.25, 0.25],  # after EOS (never used)
        [1e-9, 0.30, 0.35, 0.35],  # after A
        [1e-9, 0.90, 0.05, 0.05],  # after B
    ]
)
LOG_BIGRAM = jnp.log(jnp.asarray(BIGRAM / BIGRAM.sum(1, keepdims=True), jnp.float32))


def bigram_step(tokens, cache):
    """tokens (n, 1) -> logits (n, 1, vocab); the cache counts calls per row, so a wrong
    beam reordering of the cache is visible."""
    return LOG_BIGRAM[tokens[:, 0]][:, None, :], cache + 1


def ranked_by_enumeration(max_len):
    """Every sequence that ends in EOS within max_len, most likely first."""
    ranked = []
    for n in range(1, max_len + 1):
        for seq in itertools.product(range(1, 4), repeat=n):
            if EOS in seq[:-1] or seq[-1] != EOS:
                continue
            prev, lp = PAD, 0.0
            for tok in seq:
                lp += float(LOG_BIGRAM[prev, tok])
                prev = tok
            ranked.append((lp, list(seq)))
    return sorted(ranked, reverse=True)


def test_beam_search_finds_the_best_sequence_greedy_misses():
    (best_lp, best), (second_lp, second) = ranked_by_enumeration(4)[:2]
    assert best == [B, EOS] and second == [A, B, EOS]
    greedy, greedy_lp = decoding.greedy_decode(bigram_step, jnp.zeros((1,)), 1, 4)
    assert greedy[0].tolist() == [A, A, A, A] and float(greedy_lp[0]) < best_lp
    beams, scores = decoding.beam_search(bigram_step, jnp.zeros((2,)), 1, 2, 4, alpha=0.0)
    assert beams[0].tolist() == [[B, EOS, 0, 0], [A, B, EOS, 0]]
    np.testing.assert_allclose(scores[0], [best_lp, second_lp], rtol=1e-6)


def test_length_penalty_is_wu_et_al():
    assert float(decoding.length_penalty(3, 0.6)) == pytest.approx((8 / 6) ** 0.6)
    assert float(decoding.length_penalty(10, 0.0)) == 1.0


def test_sampling_frequencies_follow_temperature_top_k_and_top_p():
    logits = jnp.log(jnp.array([0.5, 0.3, 0.15, 0.05]))
    n = 20000

    def step(tokens, cache):
        return jnp.broadcast_to(logits, (tokens.shape[0], 1, 4)), cache

    def freqs(**kwargs):
        tokens, _ = decoding.sample_decode(
            step, None, n, 1, jax.random.key(0), eos_id=None, **kwargs
        )
        return np.bincount(np.asarray(tokens[:, 0]), minlength=4) / n

    np.testing.assert_allclose(freqs(), [0.5, 0.3, 0.15, 0.05], atol=0.012)
    hot = np.array([0.5, 0.3, 0.15, 0.05]) ** 0.5
    np.testing.assert_allclose(freqs(temperature=2.0), hot / hot.sum(), atol=0.012)
    np.testing.assert_allclose(freqs(top_k=2), [0.625, 0.375, 0, 0], atol=0.012)
    # Nucleus 0.6: keep tokens while the mass before them is < 0.6 -> the first two.
    np.testing.assert_allclose(freqs(top_p=0.6), [0.625, 0.375, 0, 0], atol=0.012)
    np.testing.assert_allclose(freqs(top_p=0.9), np.array([0.5, 0.3, 0.15, 0]) / 0.95, atol=0.012)
    assert freqs(temperature=0.0).tolist() == [1.0, 0, 0, 0]


# --------------------------------------------------------------------------- real T5
def _model():
    cfg = t5.T5Config(
        vocab_size=6,
        emb_dim=32,
        num_heads=4,
        head_dim=8,
        mlp_dim=48,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dropout_rate=0.0,
    )
    return EncoderDecoderModel(cfg)


def _inputs(batch=3):
    rng = np.random.default_rng(0)
    return {"encoder_input_tokens": jnp.asarray(rng.integers(2, 6, (batch, 7)), jnp.int32)}


@pytest.fixture(scope="module")
def t5_model():
    model = _model()
    return model, model.init(jax.random.key(3))


def _teacher_forced(model, params, inputs, seqs, adjust=lambda logits: logits):
    """Sum of each row's token log-probabilities up to and including its first EOS, from one
    full (uncached) forward pass; pad ids inside a sequence count like any token."""
    seqs = np.asarray(seqs)
    log_probs = np.asarray(
        jax.nn.log_softmax(
            adjust(
                model.logits(
                    params,
                    {
                        "encoder_input_tokens": inputs,
                        "decoder_input_tokens": shift_right(jnp.asarray(seqs)),
                    },
                )
            )
        )
    )
    totals, lengths = [], []
    for row, ids in enumerate(seqs.tolist()):
        end = ids.index(EOS) + 1 if EOS in ids else len(ids)
        totals.append(sum(log_probs[row, i, ids[i]] for i in range(end)))
        lengths.append(end)
    return np.array(totals), np.array(lengths)


def _decode(model, params, config, length=8, **kwargs):
    fn = jax.jit(
        lambda p, b: model.predict_batch(p, b, length, return_scores=True, decode=config, **kwargs)
    )
    return jax.device_get(fn(params, _inputs()))


def test_beam_width_one_equals_greedy(t5_model):
    model, params = t5_model
    greedy = _decode(model, params, decoding.DecodeConfig())
    beam = _decode(model, params, decoding.DecodeConfig("beam", beam_size=1, alpha=0.0))
    np.testing.assert_array_equal(beam[0], greedy[0])
    np.testing.assert_allclose(beam[1], greedy[1], rtol=1e-5)


def test_beam_scores_equal_teacher_forced_scores(t5_model):
    """Each returned beam, re-scored by a full teacher-forced pass, has the beam's score:
    the cache was reordered with its beams at every step. (A random tiny model likes the pad
    id, which a score cannot count, and rarely ends: both sides use the same T5 with pad
    forbidden and EOS made likelier.)"""
    model, params = t5_model
    alpha, k, length = 0.6, 4, 8
    inputs = _inputs()["encoder_input_tokens"]

    def no_pad(logits):
        return logits.at[..., PAD].set(-1e9).at[..., EOS].add(3.0)

    def run(params, inputs):
        big_inputs, encoded = decoding.repeat_for_beams(
            (inputs, model.module.apply({"params": params}, inputs, method=t5.Transformer.encode)),
            k,
        )
        step = model.decode_step_fn(params, encoded, big_inputs, length)
        return decoding.beam_search(
            lambda t, c: (lambda l, c2: (no_pad(l), c2))(*step(t, c)),
            model.init_cache(params, big_inputs, length),
            3,
            k,
            length,
            alpha,
        )

    beams, scores = jax.device_get(jax.jit(run)(params, inputs))
    assert beams.shape == (3, k, length) and np.all(np.diff(scores, axis=1) <= 1e-6)
    for j in range(k):
        total, end = _teacher_forced(model, params, inputs, beams[:, j], no_pad)
        np.testing.assert_allclose(scores[:, j], total / ((5 + end) / 6) ** alpha, rtol=1e-4)
    finished = int(np.sum(np.any(beams == EOS, axis=-1)))
    assert finished >= 6  # most beams end within 8 tokens on a vocabulary of 6


@pytest.mark.slow  # (default suite under 15 minutes: sampling's maths is tested above)
def test_sampling_on_the_cache(t5_model):
    model, params = t5_model
    greedy = _decode(model, params, decoding.DecodeConfig())
    top1 = _decode(model, params, decoding.DecodeConfig("sample", top_k=1))
    np.testing.assert_array_equal(top1[0], greedy[0])
    a = _decode(model, params, decoding.DecodeConfig("sample", temperature=1.0, seed=1))
    b = _decode(model, params, decoding.DecodeConfig("sample", temperature=1.0, seed=1))
    c = _decode(model, params, decoding.DecodeConfig("sample", temperature=1.0, seed=2))
    np.testing.assert_array_equal(a[0], b[0])  # same seed, same samples
    assert not np.array_equal(a[0], c[0])
    # Scores are the model's own log-probabilities of the sampled tokens.
    total, _ = _teacher_forced(model, params, _inputs()["encoder_input_tokens"], a[0])
    np.testing.assert_allclose(a[1], total, rtol=1e-4)


def test_bad_decode_settings_are_named():
    with pytest.raises(ValueError, match="choose one of"):
        decoding.DecodeConfig("nucleus")
    with pytest.raises(ValueError, match="top_p"):
        decoding.DecodeConfig("sample", top_p=0.0)


def test_hf_length_penalty_is_length_to_the_alpha():
    """transformers' beam scorer divides by generated_length ** length_penalty."""
    assert float(decoding.length_penalty(3, 2.0, "hf")) == pytest.approx(9.0)
    assert float(decoding.length_penalty(4, -1.0, "hf")) == pytest.approx(0.25)


@pytest.mark.parametrize(
    "binding, named",
    [(dict(beam_rule="huggingface"), "('t5x', 'hf')"), (dict(early_stopping="always"), "never")],
)
def test_unknown_beam_settings_are_refused_with_the_choices(binding, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)")):
        decoding.DecodeConfig(method="beam", **binding)
