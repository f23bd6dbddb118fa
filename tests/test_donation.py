"""The train step donates the state it is given: XLA writes the new parameters and optimizer
state over the old buffers (peak memory = one state + one step's activations, not two
states), and nothing keeps the donated arrays alive by accident."""

import jax
import numpy as np
import pytest

from t5x_like import optimizers, partitioning, trainer
from t5x_like.families.t5 import network as t5
from t5x_like.families.t5.model import EncoderDecoderModel
from tests.test_chunked_loss import VOCAB, _t5_batch

CONFIG = t5.T5Config(
    vocab_size=VOCAB,
    emb_dim=32,
    num_heads=2,
    head_dim=8,
    mlp_dim=64,
    num_encoder_layers=2,
    num_decoder_layers=2,
    dropout_rate=0.0,
)


def compile_tiny_t5_step(num_microbatches: int = 1):
    """(state, batch, compiled train step) of CONFIG with T5's Adafactor on one device."""
    model = EncoderDecoderModel(CONFIG)
    lr = optimizers.inverse_sqrt_schedule()
    optimizer = optimizers.t5_adafactor(lr)
    mesh = partitioning.make_mesh(mesh_shape=(1, 1), devices=jax.devices()[:1])
    rules = partitioning.logical_axis_rules("auto", num_partitions=1)
    layout = trainer.make_layout(model, optimizer, mesh, rules)
    state = trainer.init_state(model, optimizer, jax.random.key(0), layout)
    batch = partitioning.global_batch(
        {k: np.asarray(v) for k, v in _t5_batch(batch=4).items()}, mesh, rules
    )
    step = trainer.make_train_step(model, optimizer, lr, layout, num_microbatches)
    with layout.context():
        return state, batch, step.lower(state, batch, jax.random.key(1)).compile()


def _nbytes(tree) -> int:
    return sum(x.nbytes for x in jax.tree_util.tree_leaves(tree))


@pytest.mark.parametrize("num_microbatches", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_train_step_donates_parameters_and_optimizer_state(num_microbatches):
    state, batch, compiled = compile_tiny_t5_step(num_microbatches)

    # XLA aliases (nearly) the whole state: Adafactor's one-element placeholders for the
    # unfactored moments of vectors are the only buffers it may keep apart.
    placeholders = _nbytes([x for x in jax.tree_util.tree_leaves(state) if x.size == 1])
    assert compiled.memory_analysis().alias_size_in_bytes >= _nbytes(state) - placeholders

    old_leaves = jax.tree_util.tree_leaves((state.params, state.opt_state))
    new_state, metrics = compiled(state, batch, jax.random.key(1))
    assert all(x.is_deleted() for x in old_leaves if x.size > 1)
    with pytest.raises(RuntimeError, match="deleted|donated"):
        np.asarray(state.params["decoder"]["layers_0"]["mlp"]["wo"]["kernel"])
    assert np.isfinite(float(metrics["loss"]))
    # The new state is whole and feeds the next step (the loop's own pattern).
    new_state, metrics = compiled(new_state, batch, jax.random.key(1))
    assert int(new_state.step) == 2 and np.isfinite(float(metrics["loss"]))
