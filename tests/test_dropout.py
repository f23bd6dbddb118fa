"""Dropout as the models apply it: the same values and gradients as flax's nn.Dropout, the
form it replaced, without keeping the random generator's bits for the backward pass in every
layer. Attention dropout (`layers.dropped_product`) keeps nothing; hidden-state dropout
(`layers.Dropout`) keeps the mask packed to bits."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

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
            x = x + self.attention(
                HEADS,
                HEAD_DIM,
                dropout_rate=RATE,
                dtype=self.dtype,
                float32_logits=False,
                name=f"layer_{i}",
            )(x, x, mask, deterministic=deterministic)
        return x


def _inputs(length, dtype=jnp.float32):
    x = jax.random.normal(jax.random.key(1), (2, length, HEADS * HEAD_DIM), dtype)
    tokens = jnp.ones((2, length), jnp.int32).at[1, length // 2 :].set(0)  # a padded row
    mask = (tokens[:, None, :, None] > 0) & (tokens[:, None, None, :] > 0)
    return x, mask


def _loss_and_grads(module, params, x, mask, deterministic=False):
    def loss(p, x):
        out = module.apply(p, x, mask, deterministic, rngs={"dropout": jax.random.key(5)})
        return jnp.sum(out**2), out

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
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-11), grads, ref_grads
        )
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


# ------------------------------------------------------------------ hidden-state dropout


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize(
    "shape,broadcast_dims",
    [
        ((3, 5, 16), ()),  # BERT's and GPT's hidden states
        ((3, 5, 13), ()),  # a last axis that is not a multiple of 8 (padded when packed)
        ((3, 5, 16), (-2,)),  # T5's: one mask for every position of a row
        ((4, 6, 4), (-1,)),  # broadcast over the last axis: not packed
        ((4, 7), (0,)),
    ],
)
def test_hidden_dropout_equals_flax_dropout_exactly(shape, broadcast_dims, dtype):
    """Same stream, same mask, same arithmetic: equal bit for bit, values and gradients (the
    loss is a polynomial, so its gradient involves no summation whose order could differ)."""
    x = jax.random.normal(jax.random.key(0), shape, dtype)
    w = jax.random.normal(jax.random.key(1), shape, dtype)

    def loss(module, x):
        y = module.apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(3)})
        return jnp.sum(y * w + y * y), y

    ours = layers.Dropout(0.3, broadcast_dims=broadcast_dims)
    theirs = nn.Dropout(0.3, broadcast_dims=broadcast_dims)
    (_, y), grad = jax.jit(jax.value_and_grad(lambda x: loss(ours, x), has_aux=True))(x)
    (_, ref_y), ref_grad = jax.jit(jax.value_and_grad(lambda x: loss(theirs, x), has_aux=True))(x)
    assert y.dtype == grad.dtype == dtype
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(ref_y, np.float32))
    np.testing.assert_array_equal(np.asarray(grad, np.float32), np.asarray(ref_grad, np.float32))
    assert 0 < float(jnp.mean(y == 0)) < 1  # some dropped, some kept


def test_hidden_dropout_edge_rates_and_inference():
    x = jnp.arange(1.0, 17.0).reshape(2, 8)
    rngs = {"dropout": jax.random.key(0)}
    assert jnp.array_equal(layers.Dropout(0.5).apply({}, x, deterministic=True), x)
    assert jnp.array_equal(layers.Dropout(0.0).apply({}, x, deterministic=False), x)
    grad = jax.grad(
        lambda x: jnp.sum(layers.Dropout(1.0).apply({}, x, deterministic=False, rngs=rngs))
    )(x)
    assert jnp.array_equal(grad, jnp.zeros_like(x))  # finite: no 1 / 0 keep probability


def test_mask_bits_pack_as_numpy_packbits():
    """8 elements of the last axis a byte, element i in bit i (numpy's little bit order)."""
    mask = np.random.default_rng(0).random((3, 4, 21)) < 0.6
    packed = layers.pack_bits(jnp.asarray(mask))
    assert packed.dtype == jnp.uint8 and packed.shape == (3, 4, 3)
    np.testing.assert_array_equal(packed, np.packbits(mask, axis=-1, bitorder="little"))
    np.testing.assert_array_equal(layers.unpack_bits(packed, 21), mask)


class HiddenStack(nn.Module):
    """`depth` residual blocks of a dense layer, a nonlinearity and dropout."""

    dropout: type
    depth: int

    @nn.compact
    def __call__(self, x, deterministic):
        for i in range(self.depth):
            h = jnp.tanh(nn.Dense(x.shape[-1], name=f"dense_{i}")(x))
            x = x + self.dropout(RATE, name=f"Dropout_{i}")(h, deterministic=deterministic)
        return x


def _hidden_temp_bytes_per_layer(dropout, deterministic, x):
    temp = {}
    for depth in (2, 4):
        stack = HiddenStack(dropout, depth)
        params = stack.init(jax.random.key(3), x, True)

        def loss(p, x):
            out = stack.apply(p, x, deterministic, rngs={"dropout": jax.random.key(5)})
            return jnp.sum(out**2)

        step = jax.jit(jax.grad(loss, argnums=(0, 1)))
        temp[depth] = step.lower(params, x).compile().memory_analysis().temp_size_in_bytes
    return (temp[4] - temp[2]) / 2


def test_hidden_dropout_keeps_one_bit_per_element():
    x = jax.random.normal(jax.random.key(1), (4, 256, 128))
    elements = x.size
    plain = _hidden_temp_bytes_per_layer(layers.Dropout, True, x)
    ours = _hidden_temp_bytes_per_layer(layers.Dropout, False, x)
    flax_form = _hidden_temp_bytes_per_layer(nn.Dropout, False, x)
    # nn.Dropout differentiated as written: XLA keeps the generator's two uint32 words.
    assert flax_form - plain >= 6 * elements
    assert ours - plain <= elements / 8 + 4096
