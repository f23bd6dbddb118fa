"""Behaviour of the T5 network that the paper specifies, checked without a reference model."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like.families.t5 import network as t5
from t5x_like.families.t5.model import EncoderDecoderModel, shift_right
from t5x_like.models.base import unbox

TINY = dict(
    vocab_size=64,
    emb_dim=32,
    num_heads=4,
    head_dim=8,
    mlp_dim=48,
    num_encoder_layers=2,
    num_decoder_layers=3,
)


def _model(**overrides) -> EncoderDecoderModel:
    return EncoderDecoderModel(t5.T5Config(**{**TINY, "dropout_rate": 0.0, **overrides}))


def _batch(rng: np.random.Generator, batch=2, inputs=10, targets=7, vocab=64):
    enc = rng.integers(2, vocab, (batch, inputs)).astype(np.int32)
    enc[0, -3:] = 0
    tgt = rng.integers(2, vocab, (batch, targets)).astype(np.int32)
    return {
        "encoder_input_tokens": jnp.asarray(enc),
        "decoder_target_tokens": jnp.asarray(tgt),
        "decoder_input_tokens": shift_right(tgt),
    }


def test_mask_shapes_and_values():
    enc = jnp.array([[5, 6, 7, 0], [5, 6, 7, 8]])
    dec = jnp.array([[0, 3, 4], [0, 3, 4]])
    enc_mask = t5.encoder_self_mask(enc)
    dec_mask = t5.decoder_self_mask(dec)
    cross = t5.cross_attention_mask(dec, enc)
    assert enc_mask.shape == (2, 1, 4, 4)
    assert dec_mask.shape == (2, 1, 3, 3)
    assert cross.shape == (2, 1, 3, 4)
    np.testing.assert_array_equal(enc_mask[0, 0], [[1, 1, 1, 0]] * 3 + [[0, 0, 0, 0]])
    np.testing.assert_array_equal(dec_mask[0, 0], np.tril(np.ones((3, 3))))
    np.testing.assert_array_equal(cross[0, 0], [[1, 1, 1, 0]] * 3)
    np.testing.assert_array_equal(cross[1, 0], np.ones((3, 4)))


def test_packed_mask_keeps_examples_apart():
    seg_enc = jnp.array([[1, 1, 2, 2, 0]])
    seg_dec = jnp.array([[1, 1, 2, 0]])
    enc = jnp.array([[5, 6, 7, 8, 0]])
    dec = jnp.array([[0, 3, 0, 4]])
    np.testing.assert_array_equal(
        t5.encoder_self_mask(enc, seg_enc)[0, 0],
        [[1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 0], [0] * 5],
    )
    np.testing.assert_array_equal(
        t5.decoder_self_mask(dec, seg_dec)[0, 0],
        [
            # The padded last position (segment 0) sees only itself; it carries no loss weight.
            [1, 0, 0, 0],
            [1, 1, 0, 0],
            [0, 0, 1, 0],
            [0, 0, 0, 1],
        ],
    )
    np.testing.assert_array_equal(
        t5.cross_attention_mask(dec, enc, seg_dec, seg_enc)[0, 0],
        [[1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 0, 0]],
    )


def test_packed_row_equals_separate_rows():
    """Two examples packed into one row give the logits they get alone (relative positions
    make the packed offsets irrelevant)."""
    model = _model()
    params = model.init(jax.random.key(0))
    a_in, a_tgt = [5, 6, 7], [9, 10]
    b_in, b_tgt = [11, 12, 13, 14], [15, 16, 17]
    packed = {
        "encoder_input_tokens": jnp.array([a_in + b_in]),
        "encoder_segment_ids": jnp.array([[1] * 3 + [2] * 4]),
        "decoder_target_tokens": jnp.array([a_tgt + b_tgt]),
        "decoder_input_tokens": jnp.array([[0] + a_tgt[:-1] + [0] + b_tgt[:-1]]),
        "decoder_segment_ids": jnp.array([[1] * 2 + [2] * 3]),
    }
    packed_logits = model.logits(params, packed)
    for enc, tgt, sl in ((a_in, a_tgt, slice(0, 2)), (b_in, b_tgt, slice(2, 5))):
        alone = model.logits(
            params,
            {
                "encoder_input_tokens": jnp.array([enc]),
                "decoder_input_tokens": shift_right(jnp.array([tgt])),
            },
        )
        np.testing.assert_allclose(packed_logits[0, sl], alone[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "overrides", [{}, {"mlp_activations": ("gelu", "linear"), "logits_via_embedding": False}]
)
def test_kv_cache_decoding_equals_full_forward(overrides):
    """Teacher-forced step-by-step decoding on the cache gives the full pass's logits."""
    model = _model(**overrides)
    params = model.init(jax.random.key(1))
    batch = _batch(np.random.default_rng(0))
    full = model.logits(params, batch)
    inputs = batch["encoder_input_tokens"]
    length = batch["decoder_input_tokens"].shape[1]
    encoded = model.module.apply({"params": params}, inputs, method=t5.Transformer.encode)
    cache = model.init_cache(params, inputs, length)
    step = jax.jit(model.decode_step_fn(params, encoded, inputs, length))
    for i in range(length):
        logits, cache = step(batch["decoder_input_tokens"][:, i : i + 1], cache)
        np.testing.assert_allclose(logits[:, 0], full[:, i], atol=1e-5, rtol=1e-5)


def test_greedy_predictions_are_argmax_of_full_forward():
    model = _model()
    params = model.init(jax.random.key(2))
    batch = _batch(np.random.default_rng(1))
    tokens, scores = jax.jit(lambda p, b: model.predict_batch(p, b, 6, return_scores=True))(
        params, batch
    )
    # Re-run the full forward on the decoded prefix: each token must be the argmax given the
    # tokens before it, and the scores the sum of their log-probabilities.
    full = model.logits(params, {**batch, "decoder_input_tokens": shift_right(tokens)})
    log_probs = jax.nn.log_softmax(full)
    for row in range(tokens.shape[0]):
        total, ended = 0.0, False
        for i in range(tokens.shape[1]):
            if ended:  # after EOS (id 1) the row is padded
                assert tokens[row, i] == 0
                continue
            assert tokens[row, i] == int(jnp.argmax(full[row, i]))
            total += float(log_probs[row, i, tokens[row, i]])
            ended = int(tokens[row, i]) == 1
        np.testing.assert_allclose(scores[row], total, atol=1e-4, rtol=1e-5)


def test_relative_bias_is_one_table_per_stack():
    params = unbox(_model().init(jax.random.key(0)))
    for stack in ("encoder", "decoder"):
        assert params[stack]["relpos_bias"]["rel_embedding"].shape == (4, 32)
        for name, layer in params[stack].items():
            if name.startswith("layers_"):
                assert "relpos_bias" not in layer


def test_no_biases_and_rms_norm_scale_only():
    params = unbox(_model().init(jax.random.key(0)))
    names = {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)}
    assert not any("bias" in n and "relpos_bias" not in n for n in names)
    norm = t5.layers.RMSNorm()
    x = jnp.array([[1.0, 3.0, -2.0, 4.0]])
    y = norm.apply(norm.init(jax.random.key(0), x), x)
    np.testing.assert_allclose(y, x / np.sqrt(np.mean(np.square(x)) + 1e-6), rtol=1e-6)
    # No mean subtraction: a constant vector maps to ones, not zeros.
    constant = norm.apply({"params": {"scale": jnp.ones(3)}}, jnp.full((1, 3), 5.0))
    np.testing.assert_allclose(constant, np.ones((1, 3)), rtol=1e-5)


def test_every_parameter_has_logical_axes():
    params = _model(mlp_activations=("gelu", "linear"), logits_via_embedding=False).init(
        jax.random.key(0)
    )
    boxes = jax.tree_util.tree_leaves(params, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    assert boxes and all(isinstance(b, nn.LogicallyPartitioned) for b in boxes)
    for b in boxes:
        assert len(b.names) == b.value.ndim
        assert set(b.names) <= {"embed", "mlp", "heads", "kv", "vocab", "relpos_buckets"}


def test_untied_output_layer_std_is_inverse_sqrt_d_model():
    model = EncoderDecoderModel(
        t5.T5Config(
            vocab_size=4096,
            emb_dim=256,
            num_heads=2,
            head_dim=8,
            mlp_dim=16,
            num_encoder_layers=1,
            num_decoder_layers=1,
            logits_via_embedding=False,
        )
    )
    params = unbox(model.init(jax.random.key(0)))
    kernel = np.asarray(params["decoder"]["logits_dense"]["kernel"])
    assert kernel.shape == (256, 4096)
    np.testing.assert_allclose(kernel.std(), 256**-0.5, rtol=0.02)  # not the std-1 bug
    np.testing.assert_allclose(
        np.asarray(params["token_embedder"]["embedding"]).std(), 1.0, rtol=0.02
    )


def test_tied_logits_are_scaled_embedding_products():
    model = _model()
    params = unbox(model.init(jax.random.key(0)))
    batch = _batch(np.random.default_rng(2))
    logits = model.logits(params, batch)
    # Recompute the decoder's last hidden state via flax's capture of intermediates.
    _, state = model.module.apply(
        {"params": params},
        batch["encoder_input_tokens"],
        batch["decoder_input_tokens"],
        capture_intermediates=True,
        mutable=["intermediates"],
    )
    hidden = state["intermediates"]["decoder"]["decoder_norm"]["__call__"][0]
    expected = hidden @ params["token_embedder"]["embedding"].T / np.sqrt(32)
    np.testing.assert_allclose(logits, expected, atol=1e-5, rtol=1e-5)


def test_dropout_only_when_enabled():
    model = EncoderDecoderModel(t5.T5Config(**TINY, dropout_rate=0.1))
    params = model.init(jax.random.key(0))
    batch = _batch(np.random.default_rng(3))
    det1, det2 = model.logits(params, batch), model.logits(params, batch)
    np.testing.assert_array_equal(det1, det2)
    d1 = model.logits(params, batch, jax.random.key(1))
    d2 = model.logits(params, batch, jax.random.key(2))
    assert not np.allclose(d1, det1) and not np.allclose(d1, d2)


def test_unequal_depths():
    params = unbox(_model(num_encoder_layers=1, num_decoder_layers=4).init(jax.random.key(0)))
    assert sum(k.startswith("layers_") for k in params["encoder"]) == 1
    assert sum(k.startswith("layers_") for k in params["decoder"]) == 4
