"""Attention dropout (`layers.dropped_product`): the same values and gradients as flax's
nn.Dropout on the attention weights, the form it replaced, without keeping the random
generator's bits for the backward pass in every layer."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from t5x_like import products
from t5x_like.models import layers

HEADS, HEAD_DIM, RATE = 4, 16, 0.1


class WithFlaxDropout(layers.MultiHeadAttention):
    """The attention as it was written before: nn.Dropout on the softmax weights."""

    def _reference_attention(self, query, key, value, mask, bias, deterministic):
        logits = products.einsum_with_cpu_gradients("bqhd,bkhd->bhqk")(query, key)
        if mask is not None:
            logits = jnp.where(mask, logits, jnp.asarray(layers.NEG_INF, logits.dtype))
        weights = jax.nn.softmax(logits, axis=-1)
        weights = nn.Dropout(self.dropout_rate)(weights, deterministic=deterministic)
        return products.einsum_with_cpu_gradients("bhqk,bkhd->bqhd")(weights, value)


class Stack(nn.Module):
    """`depth` residual attention layers, to see what each layer adds to the step's memory."""

    attention: type
    depth: int
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x, mask, deterministic):
        for i in range(self.depth):
            x = x + self.attention(HEADS, HEAD_DIM, dropout_rate=RATE, dtype=self.dtype,
                                   float32_logits=False, name=f"layer_{i}")(
                x, x, mask, deterministic=deterministic)
        return x


def _inputs(length, dtype=jnp.float32):
    x = jax.random.normal(jax.random.key(1), (2, length, HEADS * HEAD_DIM), dtype)
    tokens = jnp.ones((2, length), jnp.int32).at[1, length // 2:].set(0)  # a padded row
    mask = (tokens[:, None, :, None] > 0) & (tokens[:, None, None, :] > 0)
    return x, mask


def _loss_and_grads(module, params, x, mask, deterministic=False):
    def loss(p, x):
        out = module.apply(p, x, mask, deterministic, rngs={"dropout": jax.random.key(5)})
        return jnp.sum(out ** 2), out
    return jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(params, x)


def test_values_and_gradients_equal_flax_dropout():
    """In float64, so that what is compared is the arithmetic, not float32's summation order
    (the two backward passes add the same terms in different orders)."""
    with jax.enable_x64(True):
        x, mask = _inputs(12, jnp.float64)
        ours = Stack(layers.MultiHeadAttention, depth=2, dtype=jnp.float64)
        reference = Stack(WithFlaxDropout, depth=2, dtype=jnp.float64)
        params = ours.init(jax.random.key(3), x, mask, True)
        (loss, out), grads = _loss_and_grads(ours, params, x, mask)
        (ref_loss, ref_out), ref_grads = _loss_and_grads(reference, params, x, mask)
        np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-12)
        jax.tree_util.tree_map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-11),
            grads, ref_grads)
        # Dropout is on, and the padded row's masked weights are in the comparison.
        (_, plain), _ = _loss_and_grads(ours, params, x, mask, deterministic=True)
        assert np.abs(np.asarray(plain) - np.asarray(out)).max() > 1e-3


def _temp_bytes_per_layer(attention, deterministic, length):
    x, mask = _inputs(length)
    temp = {}
    for depth in (2, 4):
        stack = Stack(attention, depth)
        params = stack.init(jax.random.key(3), x, mask, True)
        step = jax.jit(lambda p, x: _loss_and_grads(stack, p, x, mask, deterministic))
        temp[depth] = step.lower(params, x).compile().memory_analysis().temp_size_in_bytes
    return (temp[4] - temp[2]) / 2


def test_dropout_adds_no_per_layer_memory_to_the_backward_pass():
    length = 256
    weights_bytes = 2 * HEADS * length * length * 4  # one float32 (batch, heads, q, k) array
    plain = _temp_bytes_per_layer(layers.MultiHeadAttention, True, length)
    ours = _temp_bytes_per_layer(layers.MultiHeadAttention, False, length)
    flax_form = _temp_bytes_per_layer(WithFlaxDropout, False, length)
    # nn.Dropout differentiated as written: XLA keeps the generator's two uint32 arrays.
    assert flax_form - plain >= 1.5 * weights_bytes
    assert ours - plain <= 0.25 * weights_bytes
