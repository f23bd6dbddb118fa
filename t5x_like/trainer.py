"""The training step, the evaluation step and the train state's checkpoints.

One function each: `make_train_step` (loss, gradients, optax update, metrics), `make_eval_step`
(metric sums), and `Checkpointer` (orbax CheckpointManager: save every N steps, keep N, resume
from the newest complete checkpoint). Shardings are explicit on every jitted call.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax
import orbax.checkpoint as ocp
from jax.sharding import Mesh

from t5x_like import partitioning
from t5x_like.models.encoder_decoder import EncoderDecoderModel, unbox
from t5x_like.models.t5 import T5Config

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    opt_state: Any


def init_state(model: EncoderDecoderModel, optimizer: optax.GradientTransformation,
               rng: jax.Array, mesh: Mesh) -> TrainState:
    """Fresh parameters and optimizer state, created directly with their shardings."""

    def init(rng):
        params = unbox(model.init(rng))
        return TrainState(jnp.array(0, jnp.int32), params, optimizer.init(params))

    abstract = jax.eval_shape(init, rng)
    shardings = partitioning.tree_replicated(abstract, mesh)
    return jax.jit(init, out_shardings=shardings)(rng)


def make_train_step(model: EncoderDecoderModel, optimizer: optax.GradientTransformation,
                    learning_rate_fn: optax.Schedule, mesh: Mesh,
                    state_like: TrainState) -> Callable[[TrainState, Batch, jax.Array],
                                                        tuple[TrainState, Metrics]]:
    """Jitted step: dropout rng folded with the step, so a resumed run draws the same masks."""
    state_sharding = partitioning.tree_replicated(state_like, mesh)

    def train_step(state: TrainState, batch: Batch, rng: jax.Array):
        dropout_rng = jax.random.fold_in(rng, state.step)
        grad_fn = jax.value_and_grad(model.loss_fn, has_aux=True)
        (loss, sums), grads = grad_fn(state.params, batch, dropout_rng)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        del loss  # the normalised objective; report per-token values instead
        weight = jnp.maximum(sums["weight_sum"], 1.0)
        metrics = {
            "loss": sums["loss_sum"] / weight,
            "accuracy": sums["correct"] / weight,
            "z_loss": sums["z_loss_sum"] / weight,
            "learning_rate": learning_rate_fn(state.step),
            "grad_norm": optax.global_norm(grads),
            "nonpadding_tokens": sums["weight_sum"],
        }
        return TrainState(state.step + 1, params, opt_state), metrics

    return jax.jit(
        train_step,
        in_shardings=(state_sharding, partitioning.batch_sharding(mesh),
                      partitioning.replicated(mesh)),
        out_shardings=(state_sharding, partitioning.replicated(mesh)),
        donate_argnums=(0,))


def make_eval_step(model: EncoderDecoderModel, mesh: Mesh,
                   params_like: Any) -> Callable[[Any, Batch], Metrics]:
    """Jitted metric sums for one batch (summed over batches, divided at the end)."""

    def eval_step(params, batch):
        _, sums = model.loss_fn(params, batch)
        return sums

    return jax.jit(eval_step,
                   in_shardings=(partitioning.tree_replicated(params_like, mesh),
                                 partitioning.batch_sharding(mesh)),
                   out_shardings=partitioning.replicated(mesh))


class Checkpointer:
    """Train-state checkpoints in `model_dir/checkpoints`, with the model config beside them.

    Saves are asynchronous (training continues while the files are written); orbax writes each
    step to a temporary directory and renames it when complete, so a run killed mid-save leaves
    nothing that a restore would pick up.
    """

    def __init__(self, model_dir: str, keep: int | None) -> None:
        self.directory = os.path.join(os.path.abspath(model_dir), "checkpoints")
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                                 enable_async_checkpointing=True))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, state: TrainState, config: T5Config) -> None:
        """Save now (asynchronously); the caller decides when."""
        self.manager.save(int(state.step), force=True, args=ocp.args.Composite(
            params=ocp.args.StandardSave(state.params),
            opt_state=ocp.args.StandardSave(state.opt_state),
            config=ocp.args.JsonSave(config.to_json())))

    def restore(self, state_like: TrainState, step: int | None = None) -> TrainState:
        step = self.latest_step() if step is None else step
        abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, state_like)
        restored = self.manager.restore(step, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(abstract.params),
            opt_state=ocp.args.StandardRestore(abstract.opt_state)))
        return TrainState(jnp.array(step, jnp.int32), restored["params"], restored["opt_state"])

    def restore_config(self, step: int | None = None) -> T5Config:
        step = self.latest_step() if step is None else step
        restored = self.manager.restore(step, args=ocp.args.Composite(
            config=ocp.args.JsonRestore()))
        return T5Config(**restored["config"])

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
