"""`layers.add_shared_bias` is `logits + bias` and `layers.gather_buckets` is `jnp.take`, each
with a restructured backward pass: the same values and gradients as the plain operation (for a
batch-broadcast bias, in float32 and bfloat16; for T5's bucketed relative positions)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like.models import layers


@pytest.mark.parametrize(
    "bias_shape",
    [(1, 2, 5, 7), (7,), (1, 1, 1, 7)],
    ids=["over-batch", "lower-rank", "over-three-axes"],
)
@pytest.mark.parametrize(
    "dtype,bias_dtype,tol",
    [
        (jnp.float32, jnp.float32, 1e-6),
        (jnp.bfloat16, jnp.bfloat16, 1e-2),
        (jnp.bfloat16, jnp.float32, 1e-2),
    ],
    ids=["float32", "bfloat16", "bfloat16+float32-bias"],
)
def test_same_values_and_gradients_as_the_plain_sum(bias_shape, dtype, bias_dtype, tol):
    """T5's relative bias (over the batch) and BERT's masked-LM output bias (a vector over
    batch and positions; float32 on bfloat16 logits under the mixed policy)."""
    keys = jax.random.split(jax.random.key(0), 3)
    logits = jax.random.normal(keys[0], (3, 2, 5, 7), dtype)
    bias = jax.random.normal(keys[1], bias_shape, bias_dtype)
    weights = jax.random.normal(keys[2], (3, 2, 5, 7), jnp.float32)

    def loss(add):
        return lambda l, b: jnp.sum(jax.nn.softmax(add(l, b).astype(jnp.float32)) * weights)

    np.testing.assert_array_equal(layers.add_shared_bias(logits, bias), logits + bias)
    ours = jax.jit(jax.grad(loss(layers.add_shared_bias), argnums=(0, 1)))(logits, bias)
    plain = jax.jit(jax.grad(loss(jnp.add), argnums=(0, 1)))(logits, bias)
    for got, want in zip(ours, plain):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(
            np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=tol, atol=tol
        )


@pytest.mark.parametrize("bidirectional", [True, False])
def test_bucket_gather_has_the_values_and_gradient_of_take(bidirectional):
    """The relative-position table read through T5's buckets (every bucket used many times,
    some never): values equal `jnp.take`'s exactly, the gradient (a one-hot product instead of
    a scatter-add) equal up to float32 summation order."""
    positions = np.arange(40)
    buckets = jnp.asarray(
        layers.relative_position_bucket(
            positions[None, :] - positions[:, None], bidirectional, 32, 16
        ),
        jnp.int32,
    )
    table = jax.random.normal(jax.random.key(0), (3, 32))
    weights = jax.random.normal(jax.random.key(1), (3, 40, 40))

    def loss(gather):
        return lambda t: jnp.sum(jnp.tanh(gather(t)) * weights)

    np.testing.assert_array_equal(
        layers.gather_buckets(table, buckets), jnp.take(table, buckets, axis=1)
    )
    ours = jax.jit(jax.grad(loss(lambda t: layers.gather_buckets(t, buckets))))(table)
    plain = jax.jit(jax.grad(loss(lambda t: jnp.take(t, buckets, axis=1))))(table)
    assert np.count_nonzero(np.asarray(plain) == 0) > 0  # buckets no offset reaches
    np.testing.assert_allclose(ours, plain, rtol=1e-5, atol=1e-6)
