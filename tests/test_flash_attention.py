"""The Pallas flash-attention kernel with T5's relative bias computed in-kernel
(`attention_implementation='flash'`): equal to the written-out reference attention (dense bias
from `layers.RelativePositionBias`, dense masks from `t5`'s mask builders) in values and in
gradients for queries, keys, values and the bias table, over several tiles, with padding,
packing, causality and cross-attention; and a whole T5 model trains the same with it.

On CPU the kernels run in Pallas's interpreter: these tests check the arithmetic and the
tiling, not speed."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like.families.t5 import network as t5
from t5x_like.families.t5.model import EncoderDecoderModel
from t5x_like.models import base, layers
from t5x_like.models import flash_attention as fa
from tests.test_remat import T5_CONFIG, _init, _loss_and_grads

HEADS, HEAD_DIM = 2, 8
# (kernel platform, platform lowered for, the custom call its kernels become)
ACCELERATORS = [("gpu", "cuda", "__gpu$xla.gpu.triton"), ("tpu", "tpu", "tpu_custom_call")]


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 20)])
def test_in_kernel_buckets_equal_mesh_tf_buckets(bidirectional, num_buckets, max_distance):
    offsets = np.arange(-3000, 3001)
    expected = layers.relative_position_bucket(offsets, bidirectional, num_buckets, max_distance)
    spec = fa.RelativeBias(num_buckets, max_distance, bidirectional)
    got = jax.jit(lambda r: fa.relative_buckets(r, spec))(jnp.asarray(offsets, jnp.int32))
    np.testing.assert_array_equal(np.asarray(got), expected)
    # a tile whose keys are all >= max_distance after (before) its queries has one bucket
    after, before = fa._far_buckets(spec)
    assert set(expected[offsets >= max_distance]) == {after}
    assert set(expected[offsets <= -max_distance]) == {before}


def _reference(q, k, v, mask, table, spec):
    """The model's own attention maths: einsum, dense bias from the table, NEG_INF mask."""
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k)
    if table is not None:
        buckets = layers.relative_position_bucket(
            np.arange(k.shape[1])[None, :] - np.arange(q.shape[1])[:, None],
            spec.bidirectional,
            spec.num_buckets,
            spec.max_distance,
        )
        logits = logits + jnp.take(table, jnp.asarray(buckets), axis=1)[None]
    logits = jnp.where(mask, logits, layers.NEG_INF)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, axis=-1), v)


def _cases():
    """(name, q_len, kv_len, dense mask, FlashMask, bias spec or None): T5's three masks."""
    enc = np.array([[3] * 10 + [4] * 14 + [0] * 8, [5] * 32])  # packed + padded; full row
    enc_seg = np.array([[1] * 10 + [2] * 14 + [0] * 8, [1] * 32])
    dec_seg = np.array([[1] * 5 + [2] * 11, [1] * 16])
    dec = np.ones_like(dec_seg)
    real = enc > 0
    ids = fa.ids_from_segments
    enc_mask = fa.FlashMask(ids(real, enc_seg, -1), ids(real, enc_seg, -2))
    self_mask = fa.FlashMask(ids(dec > 0, dec_seg, -1), ids(dec > 0, dec_seg, -1), causal=True)
    cross = fa.FlashMask(ids(dec > 0, dec_seg, -1), ids(real, enc_seg, -2))
    return [
        (
            "encoder, packed and padded, bidirectional bias",
            32,
            32,
            t5.encoder_self_mask(enc, enc_seg),
            enc_mask,
            fa.RelativeBias(32, 128, True),
        ),
        (
            "decoder, packed, causal bias",
            16,
            16,
            t5.decoder_self_mask(dec, dec_seg),
            self_mask,
            fa.RelativeBias(32, 128, False),
        ),
        (
            "cross-attention, packed",
            16,
            32,
            t5.cross_attention_mask(dec, enc, dec_seg, enc_seg),
            cross,
            None,
        ),
        (
            "encoder, padded, few buckets",
            32,
            32,
            t5.encoder_self_mask(enc),
            fa.FlashMask(ids(real, None, -1), ids(real, None, -2)),
            fa.RelativeBias(8, 20, True),
        ),
    ]


# In the slow set: the default suite's model test below runs the same kernels (encoder, causal
# decoder and cross-attention, bias table gradients) against the XLA path.
@pytest.mark.slow
@pytest.mark.parametrize("case", [0, 1, 2, 3])
def test_kernel_equals_the_reference_attention(case):
    name, q_len, kv_len, dense, mask, spec = _cases()[case]
    keys = jax.random.split(jax.random.key(case), 5)
    q = jax.random.normal(keys[0], (2, q_len, HEADS, HEAD_DIM))
    k = jax.random.normal(keys[1], (2, kv_len, HEADS, HEAD_DIM))
    v = jax.random.normal(keys[2], (2, kv_len, HEADS, HEAD_DIM))
    table = None if spec is None else jax.random.normal(keys[3], (HEADS, spec.num_buckets))
    weights = jax.random.normal(keys[4], q.shape)  # a loss that weighs every output

    def flash(q, k, v, table):  # 8 x 16 tiles: several per row, causal blocks skipped
        return fa.flash_attention(
            q,
            k,
            v,
            mask.q_ids,
            mask.kv_ids,
            causal=mask.causal,
            relative_table=table,
            relative_bias=spec,
            block_q=8,
            block_k=16,
        )

    def reference(q, k, v, table):
        return _reference(q, k, v, dense, table, spec)

    args = (q, k, v) if table is None else (q, k, v, table)
    results = []
    for fn in (reference, flash):
        f = (lambda *a, fn=fn: fn(*a)) if table is not None else (lambda *a, fn=fn: fn(*a, None))
        out = f(*args)
        grads = jax.grad(lambda *a: jnp.sum(f(*a) * weights), argnums=tuple(range(len(args))))(
            *args
        )
        results.append((out, grads))
    (out_r, grads_r), (out_f, grads_f) = results
    np.testing.assert_allclose(out_f, out_r, rtol=1e-5, atol=1e-5, err_msg=name)
    for what, a, b in zip(("dq", "dk", "dv", "dtable"), grads_f, grads_r):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=f"{name}: {what}")


@pytest.mark.parametrize("bidirectional", [True, False])
def test_tiles_beyond_max_distance_take_the_one_bucket_path(bidirectional):
    """64 tokens on 16 x 16 tiles with max_distance 16: the tiles two or more blocks off the
    diagonal hold offsets >= 16 only and skip the per-element bucketing (forward) and the
    per-bucket sums (backward); values and every gradient still equal the reference."""
    spec = fa.RelativeBias(8, 16, bidirectional)
    keys = jax.random.split(jax.random.key(21), 5)
    q, k, v = (jax.random.normal(key, (1, 64, HEADS, HEAD_DIM)) for key in keys[:3])
    table = jax.random.normal(keys[3], (HEADS, spec.num_buckets))
    weights = jax.random.normal(keys[4], q.shape)
    ids = jnp.ones((1, 64), jnp.int32)
    dense = np.ones((1, 1, 64, 64), bool)
    if not bidirectional:
        dense = dense & np.tril(np.ones((64, 64), bool))
    static = fa._Static(
        causal=not bidirectional,
        bias=spec,
        block_q=16,
        block_k=16,
        q_len=64,
        kv_len=64,
        platform="cpu",
    )
    row = table[:1]  # the (1, buckets) row a kernel sees

    def far(q_start, k_start):
        return bool(fa._far_tile(static, jnp.int32(q_start), jnp.int32(k_start), row)[0])

    assert far(0, 32) and far(32, 0) and far(0, 48) and far(48, 16)
    assert not (far(0, 16) or far(16, 0) or far(32, 32))

    def flash(q, k, v, table):
        return fa.flash_attention(
            q,
            k,
            v,
            ids,
            ids,
            causal=not bidirectional,
            relative_table=table,
            relative_bias=spec,
            block_q=16,
            block_k=16,
        )

    def reference(q, k, v, table):
        return _reference(q, k, v, dense, table, spec)

    np.testing.assert_allclose(
        flash(q, k, v, table), reference(q, k, v, table), rtol=1e-5, atol=1e-5
    )
    grads = [
        jax.grad(lambda *a, fn=fn: jnp.sum(fn(*a) * weights), argnums=(0, 1, 2, 3))(q, k, v, table)
        for fn in (flash, reference)
    ]
    for what, a, b in zip(("dq", "dk", "dv", "dtable"), *grads):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=what)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("platform,lowering_platform,custom_call", ACCELERATORS)
def test_kernels_lower_through_triton_and_mosaic(platform, lowering_platform, custom_call, causal):
    """Triton and Mosaic accept only part of what the interpreter runs (no gathers or array
    slices in a kernel, Mosaic's (8, 128)-aligned blocks, no floor division's sign fix-up...).
    Lowering the forward and both backward kernels for each platform from this CPU host runs
    Pallas's lowering rules, which reject all of that; the accelerator's own compiler (PTX,
    libtpu) is the step left unchecked here. bf16, a sequence off the tile grid, T5's bias."""
    batch, length, heads, head_dim = 2, 200, 3, 64
    spec = fa.RelativeBias(32, 128, bidirectional=not causal)

    def loss(q, k, v, q_ids, kv_ids, table):
        out = fa.flash_attention(
            q,
            k,
            v,
            q_ids,
            kv_ids,
            causal=causal,
            relative_table=table,
            relative_bias=spec,
            platform=platform,
        )
        return jnp.sum(out.astype(jnp.float32))

    tokens = jax.ShapeDtypeStruct((batch, length, heads, head_dim), jnp.bfloat16)
    ids = jax.ShapeDtypeStruct((batch, length), jnp.int32)
    table = jax.ShapeDtypeStruct((heads, spec.num_buckets), jnp.float32)
    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 5)))
    text = (
        grad.trace(tokens, tokens, tokens, ids, ids, table)
        .lower(lowering_platforms=(lowering_platform,))
        .as_text()
    )
    assert custom_call in text
    for kernel in ("fwd", "dkdv", "dq"):
        assert f"t5_flash_attention_{kernel}" in text, kernel


def test_an_unknown_platform_is_refused():
    with pytest.raises(ValueError, match="no compiler for platform 'metal'"):
        fa.flash_attention(
            *(jnp.zeros((1, 16, 1, 8)),) * 3,
            jnp.ones((1, 16), jnp.int32),
            jnp.ones((1, 16), jnp.int32),
            platform="metal",
        )


@pytest.mark.slow
def test_bfloat16_inputs_stay_within_bfloat16_tolerance():
    name, q_len, kv_len, dense, mask, spec = _cases()[0]
    keys = jax.random.split(jax.random.key(9), 4)
    q, k, v = (jax.random.normal(key, (2, q_len, HEADS, HEAD_DIM)) for key in keys[:3])
    table = jax.random.normal(keys[3], (HEADS, spec.num_buckets))
    low = [x.astype(jnp.bfloat16) for x in (q, k, v)]
    out = fa.flash_attention(
        *low,
        mask.q_ids,
        mask.kv_ids,
        relative_table=table,
        relative_bias=spec,
        block_q=16,
        block_k=16,
    )
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(out, np.float32), _reference(q, k, v, dense, table, spec), rtol=3e-2, atol=3e-2
    )


@pytest.mark.slow
def test_lengths_off_the_tile_grid_are_padded_and_give_the_same_attention():
    """40 queries, 24 keys on 16 x 16 tiles: both padded; no real query or key may see the
    padding, and the gradients of the real positions are unchanged."""
    keys = jax.random.split(jax.random.key(11), 4)
    q = jax.random.normal(keys[0], (1, 40, HEADS, HEAD_DIM))
    k, v = (jax.random.normal(key, (1, 24, HEADS, HEAD_DIM)) for key in keys[1:3])
    q_seg, kv_seg = np.array([[1] * 25 + [2] * 15]), np.array([[1] * 14 + [2] * 10])
    dense = q_seg[:, None, :, None] == kv_seg[:, None, None, :]
    weights = jax.random.normal(keys[3], q.shape)

    def loss(fn, *args):
        return jnp.sum(fn(*args) * weights)

    def flash(q, k, v):
        return fa.flash_attention(
            q, k, v, jnp.asarray(q_seg), jnp.asarray(kv_seg), block_q=16, block_k=16
        )

    def reference(q, k, v):
        return _reference(q, k, v, dense, None, None)

    np.testing.assert_allclose(flash(q, k, v), reference(q, k, v), rtol=1e-5, atol=1e-5)
    for a, b in zip(
        jax.grad(lambda *x: loss(flash, *x), argnums=(0, 1, 2))(q, k, v),
        jax.grad(lambda *x: loss(reference, *x), argnums=(0, 1, 2))(q, k, v),
    ):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def _packed_t5_batch():
    """Two rows: one packs two examples (inputs and targets), one is padded."""
    rng = np.random.default_rng(0)
    enc = rng.integers(2, T5_CONFIG.vocab_size, (2, 16)).astype(np.int32)
    enc[1, 11:] = 0
    enc_seg = np.array([[1] * 7 + [2] * 9, [1] * 11 + [0] * 5], np.int32)
    targets = rng.integers(2, T5_CONFIG.vocab_size, (2, 8)).astype(np.int32)
    targets[1, 6:] = 0
    dec_seg = np.array([[1] * 3 + [2] * 5, [1] * 6 + [0] * 2], np.int32)
    inputs = np.concatenate([np.zeros((2, 1), np.int32), targets[:, :-1]], axis=1)
    inputs[0, 3] = 0  # the second packed example starts with its own start token
    return {
        "encoder_input_tokens": jnp.asarray(enc),
        "encoder_segment_ids": jnp.asarray(enc_seg),
        "decoder_input_tokens": jnp.asarray(inputs),
        "decoder_target_tokens": jnp.asarray(targets),
        "decoder_segment_ids": jnp.asarray(dec_seg),
        "decoder_loss_weights": jnp.asarray(targets > 0, jnp.float32),
    }


@pytest.mark.parametrize("scan_layers", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_t5_model_trains_the_same_with_the_flash_kernel(scan_layers):
    cfg = dataclasses.replace(T5_CONFIG, scan_layers=scan_layers)  # one layer each
    reference = EncoderDecoderModel(cfg)
    flash = EncoderDecoderModel(dataclasses.replace(cfg, attention_implementation="flash"))
    params = _init(reference)
    batch = _packed_t5_batch()
    (loss_r, grads_r), (loss_f, grads_f) = [
        _loss_and_grads(m, params, batch) for m in (reference, flash)
    ]
    np.testing.assert_allclose(loss_f, loss_r, rtol=1e-6)
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grads_f, grads_r
    )
    # the relative-bias tables receive their gradient through the kernel's bucket sums
    tables = [
        g
        for path, g in jax.tree_util.tree_leaves_with_path(grads_f)
        if "rel_embedding" in jax.tree_util.keystr(path)
    ]
    assert tables and all(float(jnp.abs(t).sum()) > 0 for t in tables)


@pytest.mark.parametrize("platform,lowering_platform,custom_call", ACCELERATORS)
def test_a_bfloat16_t5_step_with_the_kernel_lowers_for_accelerators(
    platform, lowering_platform, custom_call
):
    """The model's own calls (encoder, causal decoder and cross-attention masks, bias tables,
    bf16 activations) lowered for Triton and Mosaic, as `gpu_check.sh`'s flash step runs
    them: every attention of both stacks goes through the kernels."""
    cfg = dataclasses.replace(T5_CONFIG, attention_implementation="flash", dtype="bfloat16")
    model = EncoderDecoderModel(cfg)
    params = jax.eval_shape(lambda: _init(EncoderDecoderModel(T5_CONFIG)))
    batch = _packed_t5_batch()

    def loss(p):
        return base.objective(model.loss_sums(p, batch), model.loss_denominators(batch))

    with fa.compile_for(platform):
        text = (
            jax.jit(jax.grad(loss))
            .trace(params)
            .lower(lowering_platforms=(lowering_platform,))
            .as_text()
        )
    assert custom_call in text
    # one layer per stack: three attentions (encoder self, decoder self, cross), each a
    # forward and two backward kernels
    assert text.count("custom_call @" + custom_call) == 9


def test_flash_is_refused_where_no_structured_mask_is_built():
    from t5x_like.families.bert import network as bert
    from tests.test_remat import GPT_CONFIG

    for make in (
        lambda: dataclasses.replace(GPT_CONFIG, attention_implementation="flash"),
        lambda: bert.BertConfig(attention_implementation="flash"),
    ):
        with pytest.raises(ValueError, match="T5 only"):
            make()


@pytest.mark.slow
@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
@pytest.mark.parametrize("mesh_shape,layout", [((4, 2), "model_parallel"), ((8, 1), "fsdp")])
def test_a_sharded_train_step_with_the_kernel_equals_one_device_without(mesh_shape, layout):
    """The kernel under shard_map (rows over 'data', heads over 'model') gives the same
    updated parameters as the single-device reference attention: the bias tables' gradients
    summed over the batch shards included."""
    from t5x_like import optimizers, partitioning, trainer

    def one_step(implementation, shape, layout_name, devices):
        cfg = dataclasses.replace(
            T5_CONFIG,
            num_heads=4,
            head_dim=4,
            emb_dim=16,
            vocab_size=128,
            attention_implementation=implementation,
        )
        model = EncoderDecoderModel(cfg)
        lr = optimizers.inverse_sqrt_schedule(10)
        optimizer = optimizers.t5_adafactor(lr)
        mesh = partitioning.make_mesh(mesh_shape=shape, devices=devices)
        layout = trainer.make_layout(
            model, optimizer, mesh, partitioning.logical_axis_rules(layout_name)
        )
        state = trainer.init_state(model, optimizer, jax.random.key(0), layout)
        step = trainer.make_train_step(model, optimizer, lr, layout)
        batch = {k: np.concatenate([np.asarray(v)] * 4) for k, v in _packed_t5_batch().items()}
        with layout.context():
            state, metrics = step(state, layout.global_batch(batch), jax.random.key(1))
        return jax.device_get(state.params), float(metrics["loss"])

    want, want_loss = one_step("xla", (1, 1), "data_parallel", jax.devices()[:1])
    got, got_loss = one_step("flash", mesh_shape, layout, None)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, want
    )
