"""Cross-entropy options against values computed by hand."""

import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like import losses


def test_plain_cross_entropy():
    logits = jnp.array([[[2.0, 1.0, 0.0], [0.0, 0.0, 0.0]]])
    targets = jnp.array([[0, 2]])
    loss, z = losses.cross_entropy_with_logits(logits, targets)
    lse = np.log(np.exp(2) + np.exp(1) + 1)
    np.testing.assert_allclose(loss[0], [lse - 2.0, np.log(3.0)], rtol=1e-6)
    np.testing.assert_array_equal(z, 0.0)


def test_z_loss_adds_squared_log_normaliser():
    logits = jnp.array([[1.0, 2.0, 3.0]])
    lse = np.log(np.exp(1) + np.exp(2) + np.exp(3))
    loss, z = losses.cross_entropy_with_logits(logits, jnp.array([2]), z_loss=1e-4)
    np.testing.assert_allclose(z, [1e-4 * lse**2], rtol=1e-6)
    np.testing.assert_allclose(loss, [lse - 3.0 + 1e-4 * lse**2], rtol=1e-6)


def test_label_smoothing_is_zero_at_the_smoothed_optimum():
    eps, vocab = 0.1, 4
    target_dist = np.array([1 - eps, eps / 3, eps / 3, eps / 3])
    logits = jnp.log(jnp.asarray(target_dist))[None]
    loss, _ = losses.cross_entropy_with_logits(logits, jnp.array([0]), label_smoothing=eps)
    np.testing.assert_allclose(loss, [0.0], atol=1e-6)
    # And KL(smoothed || p) elsewhere.
    logits = jnp.array([[0.5, -1.0, 2.0, 0.0]])
    p = np.exp(logits[0]) / np.exp(logits[0]).sum()
    loss, _ = losses.cross_entropy_with_logits(logits, jnp.array([0]), label_smoothing=eps)
    np.testing.assert_allclose(loss, [np.sum(target_dist * np.log(target_dist / p))], rtol=1e-5)
    assert vocab == len(target_dist)


def test_weights_and_normalisation():
    logits = jnp.zeros((1, 3, 5))
    targets = jnp.array([[1, 2, 0]])
    weights = jnp.array([[1.0, 1.0, 0.0]])
    loss, _ = losses.cross_entropy_with_logits(logits, targets, weights)
    np.testing.assert_allclose(loss, [[np.log(5), np.log(5), 0.0]], rtol=1e-6)
    weight_sum = jnp.sum(weights)
    assert float(losses.normalizing_factor(weight_sum, "num_real_target_tokens")) == 2.0
    assert float(losses.normalizing_factor(weight_sum, 233472)) == 233472.0
    assert float(losses.normalizing_factor(weight_sum, None)) == 1.0
    with pytest.raises(ValueError, match="num_real_target_tokens"):
        losses.normalizing_factor(weight_sum, "tokens")


def test_target_is_argmax_matches_numpy_argmax_including_ties():
    """Small integer logits force many ties: the target counts as predicted only when it is
    the first maximal index, as numpy's argmax (and the papers' accuracy) has it."""
    rng = np.random.default_rng(0)
    logits = rng.integers(0, 3, (6, 50, 7)).astype(np.float32)
    targets = rng.integers(0, 7, (6, 50)).astype(np.int32)
    expected = np.argmax(logits, -1) == targets
    got = np.asarray(losses.target_is_argmax(jnp.asarray(logits), jnp.asarray(targets)))
    np.testing.assert_array_equal(got, expected)
    assert 0 < expected.sum() < expected.size  # both outcomes occur
    # Targets tied with an earlier maximum are not counted; tied with a later one, they are.
    tied = jnp.asarray([[1.0, 3.0, 3.0, 0.0]])
    assert not bool(losses.target_is_argmax(tied, jnp.asarray([2]))[0])
    assert bool(losses.target_is_argmax(tied, jnp.asarray([1]))[0])
