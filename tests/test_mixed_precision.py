"""bfloat16 activations change speed, not the answer: with the same float32 parameters the
loss and gradients of a bfloat16 model stay within bfloat16 rounding of the float32 model's,
for T5 and the decoder-only model; parameters, gradients and logits stay float32."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like.families.gpt.model import DecoderOnlyModel
from t5x_like.families.gpt.network import GPTConfig
from t5x_like.families.t5 import network as t5
from t5x_like.families.t5.model import EncoderDecoderModel
from t5x_like.models import base
from t5x_like.models.base import unbox
from tests.test_chunked_loss import VOCAB, _gpt_batch, _t5_batch

# bfloat16 keeps 8 significant bits: one rounding is 2**-8 ~ 0.4 % relative. A few layers of
# products and sums stay within a few of those.
BF16_RTOL = 3e-2


def _model(family: str, dtype: str):
    if family == "t5":
        return EncoderDecoderModel(
            t5.T5Config(
                vocab_size=VOCAB,
                emb_dim=32,
                num_heads=2,
                head_dim=16,
                mlp_dim=64,
                num_encoder_layers=2,
                num_decoder_layers=2,
                dropout_rate=0.0,
                mlp_activations=("gelu", "linear"),
                logits_via_embedding=False,
                dtype=dtype,
            )
        )
    return DecoderOnlyModel(
        GPTConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_layers=2,
            num_heads=2,
            intermediate_size=64,
            max_position_embeddings=16,
            dropout_rate=0.0,
            attention_dropout_rate=0.0,
            dtype=dtype,
        )
    )


@pytest.mark.parametrize("family", ["t5", "decoder_only"])
def test_bfloat16_loss_and_gradients_within_bfloat16_tolerance(family):
    batch = _t5_batch() if family == "t5" else _gpt_batch()
    f32, bf16 = _model(family, "float32"), _model(family, "bfloat16")
    init = (
        (lambda m: m.init(jax.random.key(0), 6, 8))
        if family == "t5"
        else (lambda m: m.init(jax.random.key(0)))
    )
    params = unbox(jax.jit(lambda: init(f32))())

    def loss_and_grads(model):
        def loss_fn(p):
            return base.objective(model.loss_sums(p, batch), model.loss_denominators(batch))

        return jax.jit(jax.value_and_grad(loss_fn))(params)

    loss, grads = loss_and_grads(f32)
    loss_bf16, grads_bf16 = loss_and_grads(bf16)
    assert loss_bf16.dtype == jnp.float32
    np.testing.assert_allclose(loss_bf16, loss, rtol=BF16_RTOL)
    assert abs(float(loss_bf16) - float(loss)) > 0  # bfloat16 really ran
    for (path, g), g16 in zip(
        jax.tree_util.tree_leaves_with_path(grads), jax.tree_util.tree_leaves(grads_bf16)
    ):
        assert g16.dtype == jnp.float32, path
        # Per tensor: the difference is small against the tensor's own size.
        err = np.linalg.norm(np.asarray(g16) - np.asarray(g))
        assert err <= BF16_RTOL * np.linalg.norm(np.asarray(g)) + 1e-6, (
            jax.tree_util.keystr(path),
            err,
        )
    assert jax.eval_shape(bf16.logits, params, batch).dtype == jnp.float32
