"""T5's Adafactor: attention kernels are factored as the [d_model, heads * d_kv] matrices of
Mesh-TF T5, i.e. exactly what optax's Adafactor does on those matrices."""

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t5x_like import optimizers, reductions


def _plain(lr):
    return optax.adafactor(
        learning_rate=lr,
        min_dim_size_to_factor=128,
        decay_rate=0.8,
        decay_offset=0,
        multiply_by_parameter_scale=True,
        clipping_threshold=1.0,
        momentum=None,
        eps=1e-30,
        factored=True,
    )


def test_matrix_view_is_the_mesh_tf_matrix():
    assert optimizers.matrix_view((768, 12, 64)) == (768, 768)  # query/key/value
    assert optimizers.matrix_view((12, 64, 768)) == (768, 768)  # output projection
    assert optimizers.matrix_view((1024, 128, 128)) == (1024, 16384)
    assert optimizers.matrix_view((512, 2048)) is None


def test_attention_kernel_updates_equal_adafactor_on_the_matrix():
    rng = np.random.default_rng(0)
    params = {
        "q": jnp.asarray(rng.normal(size=(256, 4, 64)), jnp.float32),
        "wi": jnp.asarray(rng.normal(size=(256, 512)), jnp.float32),
        "scale": jnp.ones((256,), jnp.float32),
    }
    grads = jax.tree_util.tree_map(lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype), params)
    ours = optimizers.t5_adafactor(0.01)
    state = ours.init(params)
    # The 3-D kernel's second moment is factored (row and column vectors), not full.
    factored = state.inner[0]
    assert factored.v_row["q"].shape == (256,) and factored.v_col["q"].shape == (256,)
    updates, _ = ours.update(grads, state, params)

    reference = _plain(0.01)
    as_matrix = dict(params, q=params["q"].reshape(256, 256))
    ref_grads = dict(grads, q=grads["q"].reshape(256, 256))
    ref_updates, _ = reference.update(ref_grads, reference.init(as_matrix), as_matrix)
    np.testing.assert_allclose(updates["q"], ref_updates["q"].reshape(256, 4, 64), rtol=1e-6)
    np.testing.assert_allclose(updates["wi"], ref_updates["wi"], rtol=1e-6)
    np.testing.assert_allclose(updates["scale"], ref_updates["scale"], rtol=1e-6)


# ------------------------------------------------------------------------------ BERT
def _bert_params():
    import flax.linen as nn

    from t5x_like.families.bert import network as bert

    cfg = bert.BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_layers=2,
        num_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
    )
    return nn.meta.unbox(
        bert.BertForPreTraining(cfg).init(jax.random.key(0), jnp.ones((1, 4), jnp.int32))["params"]
    )


def test_bert_weight_decay_mask_excludes_exactly_layernorm_and_biases():
    params = _bert_params()
    mask = optimizers.no_decay_on_norms_and_biases(params)
    skipped = sorted(
        "/".join(str(k.key) for k in path)
        for path, decays in jax.tree_util.tree_leaves_with_path(mask)
        if not decays
    )
    expected_norms = ["encoder/embeddings/layer_norm", "mlm/layer_norm"] + [
        f"encoder/layers_{i}/{n}" for i in range(2) for n in ("attention_norm", "mlp_norm")
    ]
    expected = sorted(
        [f"{n}/{leaf}" for n in expected_norms for leaf in ("scale", "bias")]
        + [
            f"encoder/layers_{i}/attention/{p}/bias"
            for i in range(2)
            for p in ("query", "key", "value", "out")
        ]
        + [f"encoder/layers_{i}/mlp/{p}/bias" for i in range(2) for p in ("wi", "wo")]
        + ["encoder/pooler/bias", "mlm/transform/bias", "mlm_output_bias", "nsp/bias"]
    )
    assert skipped == expected
    decayed = [p for p, d in jax.tree_util.tree_leaves_with_path(mask) if d]
    assert len(decayed) == 2 + 1 + 1 + 2 * 6 + 2  # embeddings, kernels of every dense


def test_bert_adamw_decays_weights_but_not_norms_or_biases():
    params = _bert_params()
    opt = optimizers.bert_adamw(0.1, weight_decay=0.01)
    zero = jax.tree_util.tree_map(jnp.zeros_like, params)
    updates, _ = opt.update(zero, opt.init(params), params)
    kernel = params["encoder"]["layers_0"]["mlp"]["wi"]["kernel"]
    np.testing.assert_allclose(
        updates["encoder"]["layers_0"]["mlp"]["wi"]["kernel"], -0.1 * 0.01 * kernel, rtol=1e-6
    )
    assert not np.any(updates["encoder"]["layers_0"]["mlp"]["wi"]["bias"])
    assert not np.any(updates["encoder"]["embeddings"]["layer_norm"]["scale"])


def test_bert_adamw_clips_the_global_gradient_norm():
    params = {"w": jnp.zeros((4,))}
    opt = optimizers.bert_adamw(1.0, weight_decay=0.0, clip_norm=1.0)
    state = opt.init(params)
    big = {"w": jnp.array([30.0, 40.0, 0.0, 0.0])}  # norm 50 -> clipped to norm 1
    small = {"w": jnp.array([0.6, 0.8, 0.0, 0.0])}
    u_big, _ = opt.update(big, state, params)
    u_small, _ = opt.update(small, state, params)
    np.testing.assert_allclose(u_big["w"], u_small["w"], rtol=1e-6)


def test_bert_learning_rate_is_warmup_then_linear_decay_from_step_zero():
    lr = optimizers.bert_learning_rate(1e-4, total_steps=100_000, warmup_steps=10_000)
    assert float(lr(0)) == 0.0
    np.testing.assert_allclose(float(lr(5_000)), 0.5e-4, rtol=1e-6)
    np.testing.assert_allclose(float(lr(10_000)), 1e-4 * 0.9, rtol=1e-6)
    np.testing.assert_allclose(float(lr(55_000)), 1e-4 * 0.45, rtol=1e-6)
    assert float(lr(100_000)) == 0.0


def _every_kind_of_parameter(rng):
    """One parameter per branch of Adafactor: factored with the large axis first (embedding)
    and second (an MLP kernel), 3-D attention kernels in both orientations, an unfactored
    matrix (the relative bias table) and a vector (a norm scale)."""
    shapes = {
        "embedding": (600, 160),
        "wi": (160, 384),
        "q": (160, 4, 40),
        "out": (4, 40, 160),
        "rel_bias": (32, 4),
        "scale": (160,),
    }
    return {k: jnp.asarray(rng.normal(size=s) * 0.05, jnp.float32) for k, s in shapes.items()}


@pytest.mark.parametrize("sums_as_dots", [True, False], ids=["dots", "reductions"])
@pytest.mark.parametrize("schedule", [True, False], ids=["schedule", "constant"])
def test_fused_adafactor_equals_optax_composition_over_steps(sums_as_dots, schedule, monkeypatch):
    """`t5_adafactor` computes optax's Adafactor chain in one pass per parameter (and on CPU
    with dot products for its sums): three steps give the same parameters and the same state,
    which keeps checkpoints written by either interchangeable."""
    monkeypatch.setattr(reductions, "sums_as_dots", lambda: sums_as_dots)
    rng = np.random.default_rng(1)
    params = _every_kind_of_parameter(rng)
    # The schedule changes between the steps (0.01, 0.01, 0.0071): the fused update must read
    # the learning rate at the schedule's own step count.
    lr = optimizers.inverse_sqrt_schedule(warmup_steps=1, scale=0.01) if schedule else 0.01
    ours, reference = optimizers.t5_adafactor(lr), optimizers.optax_t5_adafactor(lr)
    state = ours.init(params)
    assert jax.tree_util.tree_structure(state) == jax.tree_util.tree_structure(
        reference.init(params)
    )
    ref_params, ref_state = params, reference.init(params)
    for step in range(3):
        grads = jax.tree_util.tree_map(
            lambda p: jnp.asarray(rng.normal(size=p.shape) * 10.0**-step, p.dtype), params
        )
        # An embedding row no example touched has a zero gradient: its moments are eps alone.
        grads["embedding"] = grads["embedding"].at[7].set(0.0)
        updates, state = jax.jit(ours.update)(grads, state, params)
        params = optax.apply_updates(params, updates)
        ref_updates, ref_state = jax.jit(reference.update)(grads, ref_state, ref_params)
        ref_params = optax.apply_updates(ref_params, ref_updates)
        for name in params:
            np.testing.assert_allclose(
                updates[name],
                ref_updates[name],
                rtol=1e-5,
                atol=1e-9,
                err_msg=f"step {step}: {name}",
            )
            # Parameters cross zero: float32 rounding is relative to their scale, not value.
            np.testing.assert_allclose(
                params[name],
                ref_params[name],
                rtol=0,
                atol=1e-6 * float(jnp.max(jnp.abs(ref_params[name]))),
            )
        for ours_leaf, ref_leaf in zip(
            jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(ref_state)
        ):
            np.testing.assert_allclose(ours_leaf, ref_leaf, rtol=1e-5)
    assert float(state.inner[0].count) == 3


def test_global_norm_as_dots_equals_optax():
    rng = np.random.default_rng(2)
    tree = _every_kind_of_parameter(rng)
    np.testing.assert_allclose(optimizers.global_norm(tree), optax.global_norm(tree), rtol=1e-6)
    tree["scale"] = tree["scale"].at[3].set(jnp.inf)
    assert not np.isfinite(optimizers.global_norm(tree))


def test_fused_adafactor_without_params_says_what_to_pass():
    params = {"w": jnp.ones((4,), jnp.float32)}
    tx = optimizers.t5_adafactor(0.01)
    with pytest.raises(ValueError, match="with the parameters"):
        tx.update(params, tx.init(params))


# ------------------------------------------------ optimizers and schedules built by gin
@gin.configurable
def plain_sgd(learning_rate, momentum=None):
    """An optimizer the library does not know: optax's SGD on the run's schedule."""
    return optax.sgd(learning_rate, momentum=momentum)


@gin.configurable
def halving(total_steps, start=0.5):
    """A schedule the library does not know: halves every quarter of the run."""
    return optax.exponential_decay(start, max(total_steps // 4, 1), 0.5, staircase=True)


def test_a_callable_optimizer_and_schedule_are_used_as_given():
    schedule = optimizers.learning_rate_schedule(halving, total_steps=8)
    assert [float(schedule(s)) for s in (0, 1, 2, 4, 6)] == [0.5, 0.5, 0.25, 0.125, 0.0625]
    tx = optimizers.make_optimizer(plain_sgd, optax.constant_schedule(0.1))
    params = {"w": jnp.ones(3)}
    updates, _ = tx.update({"w": jnp.full(3, 2.0)}, tx.init(params), params)
    np.testing.assert_allclose(updates["w"], -0.2)  # by hand: -lr * gradient


def test_an_unknown_optimizer_name_says_how_to_bind_one():
    from t5x_like.errors import ConfigError

    with pytest.raises(ConfigError, match=r"'sgd'.*choose one of.*@my_optimizer"):
        optimizers.make_optimizer("sgd", optax.constant_schedule(0.1))


def test_a_run_trains_with_an_optimizer_and_schedule_bound_in_gin(tmp_path, capsys):
    """`Optimizer.kind=@plain_sgd` and `Schedule.kind=@halving`, configured by
    gin and unknown to `train`, drive a tiny run: each logged learning rate is the mean of
    `halving(8 steps, start 0.05)` over the logged steps, by hand (0.05, 0.05, 0.025, 0.025)
    -> 3.75e-02 at step 4 and (0.0125, 0.0125, 0.00625, 0.00625) -> 9.38e-03 at step 8."""
    from t5x_like import gin_setup, logs, train
    from tests.test_train import TINY_RUN

    gin.clear_config()
    gin_setup.parse_gin(
        ["gin_configs/runs/quickstart.gin"],
        TINY_RUN
        + [
            f"MODEL_DIR={tmp_path / 'run'}",
            "TRAIN_STEPS=8",
            "Optimizer.kind=@plain_sgd",
            "plain_sgd.momentum=0.9",
            "Schedule.kind=@halving",
            "halving.start=0.05",
            "train.log_every=4",
            "Evaluation.loss_every=0",
            "Evaluation.num_predictions=0",
            "Checkpointing.every=100",
        ],
    )
    try:
        state = train.train()
    finally:
        gin.clear_config()
    assert int(state.step) == 8
    logged = [line for line in logs.unstamped(capsys.readouterr().out) if line.startswith("step")]
    rates = [line.split("learning_rate ")[1].split()[0] for line in logged if "loss" in line]
    assert rates == ["3.75e-02", "9.38e-03"], logged
