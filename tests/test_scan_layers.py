"""`scan_layers` runs a stack as one `nn.scan`: the same network with its parameters stacked.
Given the same (restacked) parameters it gives the per-layer model's loss, gradients and
decodes; its traced program does not grow with depth; and checkpoints convert between the two
layouts (and from HuggingFace) without changing a number."""

import dataclasses

import jax
import numpy as np
import pytest

from t5x_like import decoding
from t5x_like.checkpoints import scan_layout
from t5x_like.families.bert import network as bert
from t5x_like.families.bert.model import BertPretrainingModel
from t5x_like.families.gpt.model import DecoderOnlyModel
from t5x_like.families.gpt.network import GPTConfig
from t5x_like.families.t5 import network as t5
from t5x_like.families.t5.model import EncoderDecoderModel
from t5x_like.models import base
from t5x_like.models.base import unbox
from tests.test_chunked_loss import VOCAB, _gpt_batch, _t5_batch
from tests.test_remat import bert_batch

T5_CONFIG = t5.T5Config(
    vocab_size=VOCAB,
    emb_dim=16,
    num_heads=2,
    head_dim=8,
    mlp_dim=32,
    num_encoder_layers=3,
    num_decoder_layers=2,
    dropout_rate=0.0,
    mlp_activations=("gelu", "linear"),
    logits_via_embedding=False,
)
GPT_CONFIG = GPTConfig(
    vocab_size=VOCAB,
    hidden_size=16,
    num_layers=3,
    num_heads=2,
    intermediate_size=32,
    max_position_embeddings=32,
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
)
BERT_CONFIG = bert.BertConfig(
    vocab_size=VOCAB,
    hidden_size=16,
    num_layers=3,
    num_heads=2,
    intermediate_size=32,
    max_position_embeddings=16,
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
)
BATCHES = {"t5": _t5_batch, "decoder_only": _gpt_batch, "bert": bert_batch}


def _model(family: str, **changes):
    if family == "t5":
        return EncoderDecoderModel(dataclasses.replace(T5_CONFIG, **changes))
    if family == "bert":
        return BertPretrainingModel(dataclasses.replace(BERT_CONFIG, **changes))
    return DecoderOnlyModel(dataclasses.replace(GPT_CONFIG, **changes))


def _init(model):
    if isinstance(model, EncoderDecoderModel):
        return unbox(jax.jit(lambda k: model.init(k, 6, 8))(jax.random.key(3)))
    return unbox(jax.jit(model.init)(jax.random.key(3)))


def _loss_and_grads(model, params, batch):
    def loss_fn(p):
        return base.objective(model.loss_sums(p, batch), model.loss_denominators(batch))

    return jax.jit(jax.value_and_grad(loss_fn))(params)


def _assert_trees_equal(a, b, rtol=1e-5, atol=1e-7):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    jax.tree_util.tree_map(
        lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol),
        a,
        b,
    )


def test_layout_conversion_is_exact_and_names_the_layers():
    params = _init(_model("t5"))
    stacked = scan_layout.stack_layers(params)
    assert set(stacked["encoder"]) == {"layers", "relpos_bias", "encoder_norm"}
    kernel = stacked["encoder"]["layers"]["attention"]["query"]["kernel"]
    assert kernel.shape == (3, 16, 2, 8)
    np.testing.assert_array_equal(
        kernel[2], params["encoder"]["layers_2"]["attention"]["query"]["kernel"]
    )
    assert scan_layout.is_scanned(stacked) and not scan_layout.is_scanned(params)
    back = scan_layout.unstack_layers(stacked)
    jax.tree_util.tree_map(np.testing.assert_array_equal, back, params)
    # The scanned model's own initialisation has exactly the converted layout.
    scanned_shapes = jax.eval_shape(lambda: _init(_model("t5", scan_layers=True)))
    assert jax.tree_util.tree_map(lambda a: a.shape, scanned_shapes) == jax.tree_util.tree_map(
        lambda a: a.shape, stacked
    )


@pytest.mark.parametrize(
    "family,remat",
    [
        ("t5", "none"),
        ("t5", "dots"),  # 'dots': the policy the README pairs with scanning
        ("bert", "dots"),
        pytest.param("decoder_only", "full", marks=pytest.mark.slow),
    ],
)
def test_scanned_stack_gives_the_per_layer_loss_and_gradients(family, remat):
    batch = BATCHES[family]()
    plain = _model(family)
    params = _init(plain)
    loss, grads = _loss_and_grads(plain, params, batch)
    scanned = _model(family, scan_layers=True, remat_policy=remat)
    loss_s, grads_s = _loss_and_grads(scanned, scan_layout.stack_layers(params), batch)
    np.testing.assert_allclose(loss_s, loss, rtol=1e-6)
    _assert_trees_equal(scan_layout.unstack_layers(grads_s), grads)


@pytest.mark.parametrize("method", [pytest.param("greedy", marks=pytest.mark.slow), "beam"])
def test_scanned_t5_decodes_as_the_per_layer_model(method):
    """The key/value cache is stacked too (layer axis first); beam search reorders it on the
    batch axis behind it."""
    plain = _model("t5")
    params = _init(plain)
    scanned = _model("t5", scan_layers=True)
    batch = {"encoder_input_tokens": _t5_batch()["encoder_input_tokens"]}
    config = decoding.DecodeConfig(method=method, beam_size=3)
    run = lambda model, p: jax.jit(
        lambda p: model.predict_batch(  # noqa: E731
            p, batch, 7, return_scores=True, decode=config, return_all_beams=True
        )
    )(p)
    tokens, scores = run(plain, params)
    tokens_s, scores_s = run(scanned, scan_layout.stack_layers(params))
    np.testing.assert_array_equal(tokens_s, tokens)
    np.testing.assert_allclose(scores_s, scores, rtol=1e-5)


@pytest.mark.slow  # the T5 beam test covers the stacked cache
def test_scanned_decoder_only_beam_search_matches():
    plain = _model("decoder_only")
    params = _init(plain)
    scanned = _model("decoder_only", scan_layers=True)
    prompt = np.array([[5, 6, 7, 0], [8, 9, 0, 0]], np.int32)
    config = decoding.DecodeConfig(method="beam", beam_size=2)
    run = lambda model, p: jax.jit(
        lambda p: model.predict_batch(  # noqa: E731
            p, {model.PROMPT_FEATURE: prompt}, 5, return_scores=True, decode=config
        )
    )(p)
    tokens, scores = run(plain, params)
    tokens_s, scores_s = run(scanned, scan_layout.stack_layers(params))
    np.testing.assert_array_equal(tokens_s, tokens)
    np.testing.assert_allclose(scores_s, scores, rtol=1e-5)


def test_scanned_bert_refuses_the_feature_based_approach():
    """The feature-based tagger reads every layer's output, which a scan does not keep: the
    error says what to set, when the parameters are first shaped (before any compile)."""
    from t5x_like.families.bert.model import BertTaggerModel

    scanned = dataclasses.replace(BERT_CONFIG, scan_layers=True)
    with pytest.raises(ValueError, match="scan_layers=False"):
        BertTaggerModel(scanned, num_labels=3, feature_based=True, lstm_size=8).abstract_params()
    BertTaggerModel(scanned, num_labels=3).abstract_params()  # the fine-tuned encoder scans


def _traced_size(model, params, batch) -> int:
    """Equations in the jitted train-step gradient's program, counted into sub-programs."""

    def count(jaxpr):
        return sum(
            1 + sum(count(sub) for sub in jax.core.jaxprs_in_params(e.params)) for e in jaxpr.eqns
        )

    def loss_fn(p):
        return base.objective(model.loss_sums(p, batch), model.loss_denominators(batch))

    return count(jax.make_jaxpr(jax.grad(loss_fn))(params).jaxpr)


def test_scanned_program_does_not_grow_with_depth():
    """What XLA compiles is traced once per stack when scanned, once per layer otherwise: the
    reason compile time stays flat as layers are added."""
    batch = _t5_batch()
    sizes = {}
    for scan in (False, True):
        for depth in (2, 8):
            model = _model(
                "t5", scan_layers=scan, num_encoder_layers=depth, num_decoder_layers=depth
            )
            params = jax.eval_shape(lambda m=model: _init(m))
            sizes[scan, depth] = _traced_size(model, params, batch)
    assert sizes[True, 8] == sizes[True, 2], sizes
    assert sizes[False, 8] > 2 * sizes[False, 2], sizes  # a copy of each layer
    assert sizes[True, 8] < sizes[False, 8] / 2, sizes


def _replicated(tree):
    device = jax.sharding.NamedSharding(
        jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",)), jax.sharding.PartitionSpec()
    )
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), tree
    )


@pytest.mark.parametrize("saved_scanned", [False, True])
def test_pretrained_checkpoint_loads_into_the_other_layout(tmp_path, saved_scanned):
    from t5x_like.checkpoints import params_io

    params = _init(_model("t5"))
    saved_cfg = dataclasses.replace(T5_CONFIG, scan_layers=saved_scanned)
    params_io.save_params(str(tmp_path), scan_layout.to_layout(params, saved_scanned), saved_cfg)
    wanted_cfg = dataclasses.replace(T5_CONFIG, scan_layers=not saved_scanned)
    wanted = scan_layout.to_layout(params, not saved_scanned)
    loaded = params_io.load_pretrained(str(tmp_path), wanted_cfg, _replicated(wanted))
    jax.tree_util.tree_map(np.testing.assert_array_equal, loaded, wanted)


@pytest.mark.slow  # init of two models + orbax
def test_per_layer_language_model_loads_into_a_scanned_classifier(tmp_path):
    """Layout conversion composes with grafting a fresh head and growing the embedding by
    GPT-1's special tokens."""
    from t5x_like.checkpoints import params_io
    from t5x_like.families.gpt.finetune import GPTClassifierModel

    lm_params = _init(_model("decoder_only"))
    params_io.save_params(str(tmp_path), lm_params, GPT_CONFIG)
    cfg = dataclasses.replace(GPT_CONFIG, scan_layers=True, num_special_tokens=3)
    model = GPTClassifierModel(cfg, num_labels=2)
    fresh = unbox(jax.jit(model.init)(jax.random.key(4)))
    loaded = params_io.load_pretrained(
        str(tmp_path), cfg, _replicated(fresh), fresh_params=lambda: fresh
    )
    assert jax.tree_util.tree_structure(loaded) == jax.tree_util.tree_structure(fresh)
    np.testing.assert_array_equal(
        loaded["layers"]["mlp"]["wo"]["kernel"][2], lm_params["layers_2"]["mlp"]["wo"]["kernel"]
    )
    table = np.asarray(loaded["token_embeddings"]["embedding"])
    np.testing.assert_array_equal(table[:VOCAB], lm_params["token_embeddings"]["embedding"])
    np.testing.assert_array_equal(table[VOCAB:], fresh["token_embeddings"]["embedding"][VOCAB:])
    np.testing.assert_array_equal(loaded["classifier"]["kernel"], fresh["classifier"]["kernel"])
