"""`attention_implementation='dot_product_attention'` (jax's fused attention; cuDNN flash
attention on GPUs) computes the same attention as the written-out reference: with T5's
relative bias, causal, prefix-LM and packed masks, padding, cross-attention and the KV cache,
and in whole models (T5, decoder-only, BERT), values and gradients."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like.families.bert import network as bert
from t5x_like.families.gpt.model import DecoderOnlyModel
from t5x_like.families.gpt.network import decoder_mask
from t5x_like.families.t5 import network as t5
from t5x_like.families.t5.model import EncoderDecoderModel
from t5x_like.models import layers
from tests.test_remat import GPT_CONFIG, T5_CONFIG, _gpt_batch, _init, _loss_and_grads, _t5_batch

HEADS, HEAD_DIM, WIDTH = 3, 8, 24


def _attention_pair(**kwargs):
    return [
        layers.MultiHeadAttention(HEADS, HEAD_DIM, implementation=impl, **kwargs)
        for impl in ("xla", "dot_product_attention")
    ]


def _masks():
    """(name, q_len, kv_len, mask (batch, 1, q, kv), bias or None) of each kind a model uses."""
    tokens = jnp.array([[5, 6, 7, 8, 9, 0], [5, 6, 7, 0, 0, 0]])  # second row padded
    segments = jnp.array([[1, 1, 2, 2, 2, 0], [1, 1, 1, 0, 0, 0]])  # packed first row
    prefix = jnp.array([[1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]])  # inputs of a prefix LM

    def relative_bias(bidirectional: bool):
        table = layers.RelativePositionBias(
            num_buckets=8, max_distance=16, num_heads=HEADS, bidirectional=bidirectional
        )
        return table.apply(table.init(jax.random.key(7), 6, 6), 6, 6)

    bidirectional_bias, causal_bias = relative_bias(True), relative_bias(False)
    return [
        ("encoder, relative bias, padding", 6, 6, t5.encoder_self_mask(tokens), bidirectional_bias),
        ("encoder, packed", 6, 6, t5.encoder_self_mask(tokens, segments), bidirectional_bias),
        ("causal, relative bias", 6, 6, t5.decoder_self_mask(tokens), causal_bias),
        ("causal packed", 6, 6, t5.decoder_self_mask(tokens, segments), None),
        ("prefix LM", 6, 6, decoder_mask(tokens, None, prefix), None),
        ("cross-attention", 4, 6, t5.cross_attention_mask(tokens[:, :4], tokens), None),
    ]


def _outputs_and_grads(dtype, cases):
    """Each case's output and gradients (params, queries' and keys' inputs), both
    implementations, on the same float32-initialised parameters and inputs."""
    reference, fused = _attention_pair(dtype=dtype)
    x_q = [jax.random.normal(jax.random.key(1), (2, q_len, WIDTH)) for _, q_len, _, _, _ in cases]
    x_kv = [
        jax.random.normal(jax.random.key(2), (2, kv_len, WIDTH)) for _, _, kv_len, _, _ in cases
    ]
    params = reference.init(jax.random.key(3), x_q[0], x_kv[0], cases[0][3], cases[0][4])

    @jax.jit
    def outputs_and_grads(p, xs_q, xs_kv):  # every case, both implementations, one compile
        results = {}
        for module in (reference, fused):
            for (name, _, _, mask, bias), xq, xkv in zip(cases, xs_q, xs_kv):

                def f(p, xq, xkv):
                    return module.apply(p, xq, xkv, mask, bias).astype(jnp.float32)

                grads = jax.grad(lambda *a: jnp.sum(f(*a) ** 2), argnums=(0, 1, 2))(p, xq, xkv)
                results[module.implementation, name] = (f(p, xq, xkv), grads)
        return results

    return outputs_and_grads(params, x_q, x_kv)


def test_fused_attention_equals_the_reference():
    cases = _masks()
    results = _outputs_and_grads(jnp.float32, cases)
    for name, *_ in cases:
        jax.tree_util.tree_map(
            lambda a, b: np.testing.assert_allclose(a, b, err_msg=name, rtol=1e-5, atol=1e-5),
            results["dot_product_attention", name],
            results["xla", name],
        )


def test_both_implementations_in_bfloat16_are_the_float32_attention_rounded():
    """In bfloat16 each implementation is the float32 attention up to bfloat16 rounding.
    The two sum in different orders (the reference's products run over (batch, heads)
    blocks, jax's over its own layout), so they are compared with the float32 truth, not
    element by element with each other: a gradient element that is a difference of terms
    near the array's largest carries their rounding (measured: ~1 % of the array's largest
    magnitude for both paths, 8 mantissa bits rounded a few times)."""
    cases = _masks()
    truth = _outputs_and_grads(jnp.float32, cases)
    rounded = _outputs_and_grads(jnp.bfloat16, cases)

    def close_at_bfloat16_scale(a, b, name):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        np.testing.assert_allclose(a, b, err_msg=name, rtol=0, atol=2e-2 * float(np.max(np.abs(b))))

    for name, *_ in cases:
        for implementation in ("xla", "dot_product_attention"):
            jax.tree_util.tree_map(
                lambda a, b: close_at_bfloat16_scale(a, b, f"{implementation}: {name}"),
                rounded[implementation, name],
                truth["xla", name],
            )


def test_the_kv_cache_gives_the_same_steps_with_either_implementation():
    reference, fused = _attention_pair()
    x = jax.random.normal(jax.random.key(4), (2, 5, WIDTH))
    params = reference.init(jax.random.key(5), x, x)
    outs = {}
    for module in (reference, fused):
        cache = module.init(jax.random.key(5), x, x, decode=True)["cache"]
        steps = []
        for i in range(5):
            out, variables = module.apply(
                {**params, "cache": cache},
                x[:, i : i + 1],
                x[:, i : i + 1],
                decode=True,
                mutable=["cache"],
            )
            cache = variables["cache"]
            steps.append(out)
        outs[module.implementation] = jnp.concatenate(steps, axis=1)
    np.testing.assert_allclose(outs["dot_product_attention"], outs["xla"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", ["t5", "decoder_only"])
def test_whole_models_train_the_same_with_fused_attention(family):
    if family == "t5":
        models = [
            EncoderDecoderModel(dataclasses.replace(T5_CONFIG, attention_implementation=a))
            for a in ("xla", "dot_product_attention")
        ]
        batch = _t5_batch()
    else:
        models = [
            DecoderOnlyModel(dataclasses.replace(GPT_CONFIG, attention_implementation=a))
            for a in ("xla", "dot_product_attention")
        ]
        batch = _gpt_batch()
    params = _init(models[0])
    (loss_r, grads_r), (loss_f, grads_f) = [_loss_and_grads(m, params, batch) for m in models]
    np.testing.assert_allclose(loss_f, loss_r, rtol=1e-6)
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grads_f, grads_r
    )


def test_bad_implementation_names_are_refused():
    for make in (
        lambda: dataclasses.replace(T5_CONFIG, attention_implementation="splash"),
        lambda: dataclasses.replace(GPT_CONFIG, attention_implementation="splash"),
        lambda: bert.BertConfig(attention_implementation="splash"),
    ):
        with pytest.raises(ValueError, match="choose one of"):
            make()
