"""The non-finite guard: a NaN injected through the gin fault hook triggers each policy; loss
spikes are flagged against the recent median."""

from __future__ import annotations

import math
import os

import jax
import numpy as np
import optax
import pytest

from t5x_like import logs, partitioning, run_health, train, trainer
from t5x_like.checkpoints import train_state
from t5x_like.errors import ConfigError
from t5x_like.families.t5.model import EncoderDecoderModel
from t5x_like.families.t5.network import T5Config
from tests.test_train import TINY_RUN


def _tiny_step(policy, inject=(1,)):
    model = EncoderDecoderModel(
        T5Config(
            vocab_size=64,
            emb_dim=16,
            num_heads=2,
            head_dim=8,
            mlp_dim=32,
            num_encoder_layers=1,
            num_decoder_layers=1,
            dropout_rate=0.0,
        )
    )
    tx = optax.adam(1e-2)
    mesh = partitioning.make_mesh(num_partitions=1)
    layout = trainer.make_layout(model, tx, mesh, partitioning.logical_axis_rules())
    state = trainer.init_state(model, tx, jax.random.key(0), layout)
    step = trainer.make_train_step(
        model, tx, lambda s: 1e-2, layout, nonfinite_policy=policy, inject_nonfinite_at_steps=inject
    )
    rows = np.arange(8 * 6).reshape(8, 6) % 60 + 2
    batch = {
        "encoder_input_tokens": rows,
        "decoder_input_tokens": rows,
        "decoder_target_tokens": rows,
        "decoder_loss_weights": np.ones_like(rows),
    }
    return state, step, layout.global_batch(batch)


@pytest.mark.parametrize(
    "policy",
    [
        pytest.param("skip", marks=pytest.mark.slow),
        "stop",
        pytest.param("none", marks=pytest.mark.slow),
    ],
)
def test_a_nan_step_keeps_the_old_state_under_skip_and_stop(policy):
    state, step, batch = _tiny_step(policy)
    before = jax.device_get(state)
    state, metrics = step(state, batch, jax.random.key(1))  # step 1: NaN injected
    after = jax.device_get(state)
    assert int(metrics["nonfinite"]) == 1 and math.isnan(float(metrics["loss"]))
    leaves = jax.tree_util.tree_leaves((after.params, after.opt_state))
    if policy == "none":
        assert any(np.isnan(x).any() for x in leaves if x.dtype.kind == "f")
        return
    for a, b in zip(jax.tree_util.tree_leaves((before.params, before.opt_state)), leaves):
        np.testing.assert_array_equal(a, b)
    assert int(after.step) == (1 if policy == "skip" else 0)
    if policy == "skip":  # the next, clean step updates from the kept state
        state, metrics = step(state, batch, jax.random.key(1))
        assert int(metrics["nonfinite"]) == 0 and np.isfinite(float(metrics["loss"]))
        assert int(state.step) == 2
        moved = [
            not np.array_equal(a, b)
            for a, b in zip(
                jax.tree_util.tree_leaves(before.params),
                jax.tree_util.tree_leaves(jax.device_get(state.params)),
            )
        ]
        assert all(moved)


def test_unknown_policy_is_refused():
    with pytest.raises(ConfigError, match="nonfinite_policy='ignore'.*stop, skip, none"):
        _tiny_step("ignore")


def _run(tmp_path, *bindings):
    return train.main(
        ["--gin_file=gin_configs/runs/quickstart.gin"]
        + [f"--gin.{b}" for b in TINY_RUN]
        + [
            f"--gin.MODEL_DIR={tmp_path}/run",
            "--gin.Evaluation.loss_every=0",
            "--gin.Evaluation.num_predictions=0",
            "--gin.train.log_every=2",
            "--gin.Checkpointing.every=100",
            *bindings,
        ]
    )


@pytest.mark.slow  # a training run (the default suite must stay under 15 minutes)
def test_stop_policy_saves_the_last_good_state_and_names_step_and_metric(tmp_path, capsys):
    code = _run(tmp_path, "--gin.TRAIN_STEPS=8", "--gin.Health.inject_nonfinite_at_steps=(5,)")
    assert code == 3
    err = capsys.readouterr().err
    assert "step 5: non-finite loss nan, grad_norm nan; training stopped" in err
    assert "the last good state (step 4) is in" in err and "nonfinite_policy=skip" in err
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["4"]


@pytest.mark.slow  # a training run (the default suite must stay under 15 minutes)
def test_skip_policy_drops_the_update_counts_it_and_goes_on(tmp_path, capsys):
    code = _run(
        tmp_path,
        "--gin.TRAIN_STEPS=6",
        "--gin.Health.inject_nonfinite_at_steps=(3,)",
        "--gin.Health.nonfinite_policy=skip",
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "step       3  non-finite loss nan, grad_norm nan: update skipped" in out
    losses = [line for line in logs.unstamped(out) if line.startswith("step") and "  loss " in line]
    assert len(losses) == 3 and "nan" not in " ".join(losses)
    record = train_state.Checkpointer(str(tmp_path / "run"), None).restore_record(6)
    assert record["nonfinite_steps"] == 1


def test_loss_spikes_are_flagged_against_the_recent_median():
    spikes = run_health.LossSpikes(ratio=1.5, history=5, min_history=3)
    assert [spikes.check(s, v) for s, v in enumerate([4.0, 4.2, 3.9])] == [None] * 3
    assert spikes.check(3, 5.9) is None  # 5.9 < 1.5 x 4.0
    message = spikes.check(4, 6.4)  # median of (4.0, 4.2, 3.9, 5.9) is 4.2; 6.4 > 6.3
    assert message and "loss spike: 6.4000 is 1.52x the median 4.2000 of the previous 4" in message
    assert spikes.check(5, float("nan")) is None
    with pytest.raises(ConfigError, match="loss_spike_ratio=1.0 must be > 1"):
        run_health.LossSpikes(ratio=1.0)
