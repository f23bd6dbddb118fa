"""The chunked cross-entropy (`loss_chunk_length`) changes memory, never results: loss, z-loss,
accuracy and gradients equal the plain loss on the whole logits, for T5 (tied and untied output
layers) and the decoder-only model, and the traced step never holds (batch, length, vocab)
logits."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like import losses
from t5x_like.families.gpt.model import DecoderOnlyModel
from t5x_like.families.gpt.network import GPTConfig
from t5x_like.families.t5 import network as t5
from t5x_like.families.t5.model import EncoderDecoderModel
from t5x_like.models import base
from t5x_like.models.base import unbox

VOCAB = 97


def _assert_trees_close(a, b, rtol=2e-5, atol=2e-6):
    jax.tree_util.tree_map(
        lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol),
        a,
        b,
    )


@pytest.mark.parametrize("chunk_length", [1, 3, 5, 8])
def test_chunked_sums_and_gradients_equal_the_plain_loss(chunk_length):
    keys = jax.random.split(jax.random.key(0), 4)
    hidden = jax.random.normal(keys[0], (3, 7, 16))
    kernel = jax.random.normal(keys[1], (16, VOCAB)) * 0.3
    targets = jax.random.randint(keys[2], (3, 7), 1, VOCAB)
    weights = (jax.random.uniform(keys[3], (3, 7)) > 0.3).astype(jnp.float32)
    options = dict(label_smoothing=0.1, z_loss=1e-4)

    def plain(h, k):
        return losses.loss_sums(h @ k, targets, weights, **options)

    def chunked(h, k):
        return losses.chunked_loss_sums(
            lambda x: x @ k, h, targets, weights, chunk_length, **options
        )

    _assert_trees_close(jax.jit(chunked)(hidden, kernel), jax.jit(plain)(hidden, kernel))
    objective = lambda fn: jax.jit(
        jax.grad(  # noqa: E731
            lambda h, k: fn(h, k)["loss_sum"], argnums=(0, 1)
        )
    )
    _assert_trees_close(objective(chunked)(hidden, kernel), objective(plain)(hidden, kernel))


def _t5_batch(batch=2, inputs=6, targets=8):
    rng = np.random.default_rng(0)
    dec_targets = rng.integers(2, VOCAB, (batch, targets)).astype(np.int32)
    dec_targets[1, 5:] = 0  # padding
    return {
        "encoder_input_tokens": jnp.asarray(rng.integers(2, VOCAB, (batch, inputs)), jnp.int32),
        "decoder_input_tokens": jnp.asarray(
            np.concatenate([np.zeros((batch, 1), np.int32), dec_targets[:, :-1]], axis=1)
        ),
        "decoder_target_tokens": jnp.asarray(dec_targets),
        "decoder_loss_weights": jnp.asarray(dec_targets > 0, jnp.float32),
    }


def _t5(tied: bool, chunk: int | None) -> EncoderDecoderModel:
    cfg = t5.T5Config(
        vocab_size=VOCAB,
        emb_dim=16,
        num_heads=2,
        head_dim=8,
        mlp_dim=32,
        num_encoder_layers=1,
        num_decoder_layers=2,
        logits_via_embedding=tied,
        mlp_activations=("gelu", "linear"),
        dropout_rate=0.0,
    )
    return EncoderDecoderModel(cfg, label_smoothing=0.1, z_loss=1e-4, loss_chunk_length=chunk)


def _gpt(chunk: int | None) -> DecoderOnlyModel:
    cfg = GPTConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        num_layers=2,
        num_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
    )
    return DecoderOnlyModel(cfg, loss_chunk_length=chunk)


def _gpt_batch():
    batch = _t5_batch()
    return {k: v for k, v in batch.items() if k.startswith("decoder_")}


CASES = {
    "t5_tied": (functools.partial(_t5, True), _t5_batch),
    "t5_untied": (functools.partial(_t5, False), _t5_batch),
    "decoder_only": (_gpt, _gpt_batch),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_models_train_on_the_same_loss_and_gradients_with_a_chunked_loss(case):
    make, make_batch = CASES[case]
    batch = make_batch()
    plain, chunked = make(None), make(3)  # 3 does not divide the 8 target positions
    params = unbox(
        plain.init(jax.random.key(1))
        if case == "decoder_only"
        else plain.init(jax.random.key(1), 6, 8)
    )

    def value_and_grad(model):
        def loss_fn(p):  # what trainer.make_train_step differentiates
            sums = model.loss_sums(p, batch)
            return base.objective(sums, model.loss_denominators(batch)), sums

        (loss, sums), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params)
        return loss, sums, grads

    loss_p, sums_p, grads_p = value_and_grad(plain)
    loss_c, sums_c, grads_c = value_and_grad(chunked)
    np.testing.assert_allclose(loss_c, loss_p, rtol=1e-6)
    _assert_trees_close(sums_c, sums_p)
    _assert_trees_close(grads_c, grads_p)
    assert float(sums_p["weight_sum"]) == 13.0  # 8 + 5 real target tokens


def _shapes_in(jaxpr) -> set[tuple[int, ...]]:
    shapes = set()
    for eqn in jaxpr.eqns:
        shapes.update(tuple(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape"))
        for sub in jax.core.jaxprs_in_params(eqn.params):
            shapes |= _shapes_in(sub)
    return shapes


def test_the_chunked_step_never_holds_the_whole_logits():
    batch = _t5_batch()
    model_plain, model_chunked = _t5(False, None), _t5(False, 4)
    params = unbox(model_plain.init(jax.random.key(1), 6, 8))
    full_logits = (2, 8, VOCAB)

    def traced(model):
        grad_fn = jax.grad(lambda p: model.loss_sums(p, batch)["loss_sum"])
        return _shapes_in(jax.make_jaxpr(grad_fn)(params).jaxpr)

    assert full_logits in traced(model_plain)
    shapes = traced(model_chunked)
    assert full_logits not in shapes and (2, 4, VOCAB) in shapes
