"""`layers.add_shared_bias` is `logits + bias` with a restructured backward pass: the same
values and gradients as the plain sum (for a batch-broadcast bias, in float32 and bfloat16)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like.models import layers


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-6), (jnp.bfloat16, 1e-2)])
def test_same_values_and_gradients_as_the_plain_sum(dtype, tol):
    keys = jax.random.split(jax.random.key(0), 3)
    logits = jax.random.normal(keys[0], (3, 2, 5, 7), dtype)
    bias = jax.random.normal(keys[1], (1, 2, 5, 7), dtype)
    weights = jax.random.normal(keys[2], (3, 2, 5, 7), jnp.float32)

    def loss(add):
        return lambda l, b: jnp.sum(jax.nn.softmax(add(l, b).astype(jnp.float32)) * weights)

    np.testing.assert_array_equal(layers.add_shared_bias(logits, bias), logits + bias)
    ours = jax.jit(jax.grad(loss(layers.add_shared_bias), argnums=(0, 1)))(logits, bias)
    plain = jax.jit(jax.grad(loss(jnp.add), argnums=(0, 1)))(logits, bias)
    for got, want in zip(ours, plain):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                                   rtol=tol, atol=tol)
