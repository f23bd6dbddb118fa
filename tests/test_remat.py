"""Rematerialisation changes what the backward pass keeps, never the parameters or the
gradients: every policy gives the plain model's loss and gradients, for T5, BERT and the
decoder-only model, and a run may resume under another policy."""

import dataclasses

import jax
import numpy as np
import pytest

from benchmarks import families
from t5x_like.families.bert import network as bert
from t5x_like.families.bert.model import BertPretrainingModel
from t5x_like.families.gpt.model import DecoderOnlyModel
from t5x_like.families.gpt.network import GPTConfig
from t5x_like.families.t5 import network as t5
from t5x_like.families.t5.model import EncoderDecoderModel
from t5x_like.models import base, layers
from t5x_like.models.base import unbox
from tests.test_chunked_loss import VOCAB, _gpt_batch, _t5_batch

T5_CONFIG = t5.T5Config(
    vocab_size=VOCAB,
    emb_dim=16,
    num_heads=2,
    head_dim=8,
    mlp_dim=32,
    num_encoder_layers=1,
    num_decoder_layers=1,
    dropout_rate=0.0,
    mlp_activations=("gelu", "linear"),
)
GPT_CONFIG = GPTConfig(
    vocab_size=VOCAB,
    hidden_size=16,
    num_layers=2,
    num_heads=2,
    intermediate_size=32,
    max_position_embeddings=16,
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
)
BERT_CONFIG = bert.BertConfig(
    vocab_size=VOCAB,
    hidden_size=16,
    num_layers=2,
    num_heads=2,
    intermediate_size=32,
    max_position_embeddings=16,
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
)


def bert_batch() -> dict:
    """Sentence pairs of 12 tokens, 3 masked predictions each, the second row padded after
    8 tokens (so the attention mask matters)."""
    batch = families.bert_batch(BERT_CONFIG, 2, 12, 3)
    batch["input_mask"][1, 8:] = 0
    batch["input_ids"][1, 8:] = 0
    batch["masked_lm_positions"][1] = [1, 4, 6]
    return batch


def _loss_and_grads(model, params, batch):
    def loss_fn(p):
        sums = model.loss_sums(p, batch)
        return base.objective(sums, model.loss_denominators(batch))

    return jax.jit(jax.value_and_grad(loss_fn))(params)


def _models(family: str, policy: str):
    if family == "t5":
        return EncoderDecoderModel(dataclasses.replace(T5_CONFIG, remat_policy=policy)), _t5_batch()
    if family == "bert":
        return BertPretrainingModel(
            dataclasses.replace(BERT_CONFIG, remat_policy=policy)
        ), bert_batch()
    return DecoderOnlyModel(dataclasses.replace(GPT_CONFIG, remat_policy=policy)), _gpt_batch()


def _init(model):
    if isinstance(model, EncoderDecoderModel):
        return unbox(jax.jit(lambda k: model.init(k, 6, 8))(jax.random.key(3)))
    return unbox(jax.jit(model.init)(jax.random.key(3)))


def _check_policies(family: str, policies) -> None:
    plain, batch = _models(family, "none")
    params = _init(plain)
    loss, grads = _loss_and_grads(plain, params, batch)
    for policy in policies:
        model, _ = _models(family, policy)
        assert jax.tree_util.tree_structure(
            jax.eval_shape(lambda: _init(model))
        ) == jax.tree_util.tree_structure(params), policy  # same parameter names
        loss_r, grads_r = _loss_and_grads(model, params, batch)
        np.testing.assert_allclose(loss_r, loss, rtol=1e-6, err_msg=policy)
        jax.tree_util.tree_map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7, err_msg=policy),
            grads_r,
            grads,
        )


# T5 with two policies in the default suite (a compile each; the default suite stays under 15
# minutes); the decoder-only pair and every (family, policy) in the slow set.
@pytest.mark.parametrize(
    "family,policies",
    [
        ("t5", ("full", "save_qkv_proj")),
        ("bert", ("full", "dots")),
        pytest.param("decoder_only", ("dots", "dots_no_batch"), marks=pytest.mark.slow),
    ],
)
def test_remat_policies_give_the_plain_gradients(family, policies):
    _check_policies(family, policies)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["t5", "bert", "decoder_only"])
def test_every_remat_policy_gives_the_plain_gradients(family):
    _check_policies(family, sorted(set(layers.REMAT_POLICIES) - {"none"}))


def _count_dots(jaxpr) -> int:
    count = 0
    for eqn in jaxpr.eqns:
        count += eqn.primitive.name == "dot_general"
        for sub in jax.core.jaxprs_in_params(eqn.params):
            count += _count_dots(sub)
    return count


@pytest.mark.parametrize("family", ["t5", "bert"])
def test_the_full_policy_recomputes_the_forward_in_the_backward_pass(family):
    """Not a no-op: the gradient of a rematerialised model runs the layers' matmuls again."""
    counts = {}
    for policy in ("none", "full"):
        model, batch = _models(family, policy)
        params = _init(model)
        jaxpr = jax.make_jaxpr(
            jax.grad(
                lambda p: base.objective(model.loss_sums(p, batch), model.loss_denominators(batch))
            )
        )(params)
        counts[policy] = _count_dots(jaxpr.jaxpr)
    assert counts["full"] > counts["none"], counts


def test_unknown_policy_and_shared_stack_are_refused():
    with pytest.raises(ValueError, match="choose one of"):
        dataclasses.replace(T5_CONFIG, remat_policy="sometimes")
    with pytest.raises(ValueError, match="shared_encoder_decoder=False"):
        dataclasses.replace(T5_CONFIG, remat_policy="full", shared_encoder_decoder=True)
    with pytest.raises(ValueError, match="choose one of"):
        dataclasses.replace(GPT_CONFIG, remat_policy="sometimes")
    with pytest.raises(ValueError, match="choose one of"):
        dataclasses.replace(BERT_CONFIG, remat_policy="sometimes")
