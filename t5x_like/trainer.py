"""The training step, the evaluation step and the train state's checkpoints.

`make_layout` decides where the train state lives (mesh, rules, shardings); `make_train_step`
(loss, gradients with optional micro-batch accumulation, optax update, metrics) and
`make_eval_step` (metric sums) are jitted with those shardings explicitly. The train state's
checkpoints are `t5x_like.checkpoints.train_state`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Iterator

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from t5x_like import optimizers, partitioning
from t5x_like.errors import ConfigError
from t5x_like.models import base
from t5x_like.models.base import Model, unbox

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    opt_state: Any


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where everything lives: the mesh, the logical-axis rules and the train state's
    shardings (parameters from their logical axes, optimizer state derived from them)."""

    mesh: Mesh
    rules: partitioning.Rules
    state_shardings: TrainState
    boxed_params: Any  # abstract, with logical axis names (for reports)

    @property
    def batch_sharding(self):
        return partitioning.batch_sharding(self.mesh, self.rules)

    def global_batch(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """This process's rows -> global arrays split over the layout's batch axes."""
        return partitioning.global_batch(batch, self.mesh, self.rules)

    @property
    def replicated(self):
        return partitioning.replicated(self.mesh)

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        """Mesh and rules in scope, so the model's activation constraints apply when traced."""
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(list(self.rules)):
            yield


def make_layout(
    model: Model, optimizer: optax.GradientTransformation, mesh: Mesh, rules: partitioning.Rules
) -> Layout:
    """Shardings of the whole train state, from abstract shapes only (nothing allocated)."""
    boxed = model.abstract_params()
    param_shardings = partitioning.param_shardings(boxed, mesh, rules)
    params = unbox(boxed)
    opt_state = jax.eval_shape(optimizer.init, params)
    opt_shardings = partitioning.derived_shardings(opt_state, params, param_shardings, mesh)
    shardings = TrainState(partitioning.replicated(mesh), param_shardings, opt_shardings)
    return Layout(mesh, tuple(rules), shardings, boxed)


def abstract_state(
    model: Model, optimizer: optax.GradientTransformation, layout: Layout
) -> TrainState:
    """ShapeDtypeStructs of the train state, carrying their shardings."""
    params = unbox(layout.boxed_params)
    state = TrainState(
        jax.ShapeDtypeStruct((), jnp.int32), params, jax.eval_shape(optimizer.init, params)
    )
    return jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        state,
        layout.state_shardings,
    )


def init_state(
    model: Model, optimizer: optax.GradientTransformation, rng: jax.Array, layout: Layout
) -> TrainState:
    """Fresh parameters and optimizer state, each created directly on its shards."""

    def init(rng):
        params = unbox(model.init(rng))
        return TrainState(jnp.array(0, jnp.int32), params, optimizer.init(params))

    with layout.context():
        return jax.jit(init, out_shardings=layout.state_shardings)(rng)


def state_from_params(
    params: Any, optimizer: optax.GradientTransformation, layout: Layout
) -> TrainState:
    """Step 0 with given (e.g. pretrained) parameters and a fresh optimizer state, sharded."""

    def init(params):
        return TrainState(jnp.array(0, jnp.int32), params, optimizer.init(params))

    with layout.context():
        return jax.jit(init, out_shardings=layout.state_shardings)(params)


def _split_microbatches(batch: Batch, num_microbatches: int) -> Batch:
    """(B, ...) -> (k, B/k, ...) taking every k-th row, so each micro-batch draws rows from
    every data shard alike."""

    def split(x):
        x = x.reshape(x.shape[0] // num_microbatches, num_microbatches, *x.shape[1:])
        return jnp.swapaxes(x, 0, 1)

    return jax.tree_util.tree_map(split, batch)


NONFINITE_POLICIES = ("stop", "skip", "none")


def make_train_step(
    model: Model,
    optimizer: optax.GradientTransformation,
    learning_rate_fn: optax.Schedule,
    layout: Layout,
    num_microbatches: int = 1,
    nonfinite_policy: str = "stop",
    inject_nonfinite_at_steps: tuple[int, ...] = (),
) -> jax.stages.Wrapped:
    """Jitted step with explicit shardings: (state, batch, rng) -> (state, metrics). Gradients
    of the summed loss are accumulated over `num_microbatches` and normalised once by the whole
    batch's normaliser, so accumulation equals the full-batch step. The dropout rng is folded
    with the step (and micro-batch), so a resumed run draws the same masks.

    Non-finite guard: when the loss or the gradient norm is NaN/Inf the step keeps the old
    parameters and optimizer state (metric `nonfinite` = 1). Under "skip" the step counter
    still advances (the batch is dropped and training goes on); under "stop" it does not, so
    the returned state is the last good one, to be saved before stopping. "none" applies
    whatever the update is. `inject_nonfinite_at_steps` is a fault hook for tests and drills:
    the steps (numbered as logged, 1 = the first update) whose gradients and loss become NaN.
    """
    if nonfinite_policy not in NONFINITE_POLICIES:
        raise ConfigError(
            f"Health.nonfinite_policy={nonfinite_policy!r}: choose one of "
            f"{', '.join(NONFINITE_POLICIES)}."
        )

    def grads_and_sums(params, batch, rng):
        # Divisors from the whole batch, so each micro-batch's gradient is already its share
        # of the full-batch gradient and the shares simply add up.
        denominators = model.loss_denominators(batch)

        def objective(p, b, r):
            sums = model.loss_sums(p, b, r)
            return base.objective(sums, denominators), sums

        grad_fn = jax.grad(objective, has_aux=True)
        if num_microbatches <= 1:
            return grad_fn(params, batch, rng)
        # Each micro-batch must still split evenly over the data-parallel devices: XLA pads
        # an uneven split, and with padded shards its partitioner has produced wrong
        # gradients (model-parallel mesh, 2 rows over 4 data shards) with no error.
        rows = jax.tree_util.tree_leaves(batch)[0].shape[0]
        partitioning.check_batch_size(rows, layout.mesh, num_microbatches, layout.rules)
        micro = _split_microbatches(batch, num_microbatches)

        def accumulate(carry, inputs):
            grads, sums = carry
            mb, index = inputs
            g, s = grad_fn(params, mb, jax.random.fold_in(rng, index))
            return (
                jax.tree_util.tree_map(jnp.add, grads, g),
                jax.tree_util.tree_map(jnp.add, sums, s),
            ), None

        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        first = jax.tree_util.tree_map(lambda x: x[0], micro)
        zero_sums = jax.tree_util.tree_map(
            lambda x: jnp.zeros(x.shape, x.dtype),
            jax.eval_shape(model.loss_sums, params, first, rng),
        )
        (grads, sums), _ = jax.lax.scan(
            accumulate, (zeros, zero_sums), (micro, jnp.arange(num_microbatches))
        )
        return grads, sums

    def train_step(state: TrainState, batch: Batch, rng: jax.Array):
        dropout_rng = jax.random.fold_in(rng, state.step)
        grads, sums = grads_and_sums(state.params, batch, dropout_rng)
        metrics = model.metrics(sums)
        if inject_nonfinite_at_steps:
            fault = jnp.where(
                jnp.isin(state.step + 1, jnp.asarray(inject_nonfinite_at_steps)), jnp.nan, 1.0
            )
            grads = jax.tree_util.tree_map(lambda g: g * fault.astype(g.dtype), grads)
            metrics["loss"] = metrics["loss"] * fault
        grad_norm = optimizers.global_norm(grads)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        step = state.step + 1
        finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
        if nonfinite_policy != "none":
            keep_old = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
            params = jax.tree_util.tree_map(keep_old, params, state.params)
            opt_state = jax.tree_util.tree_map(keep_old, opt_state, state.opt_state)
            if nonfinite_policy == "stop":
                step = jnp.where(finite, step, state.step)
        metrics = {
            **metrics,
            "learning_rate": learning_rate_fn(state.step),
            "grad_norm": grad_norm,
            "param_norm": optimizers.global_norm(params),
            "nonfinite": (~finite).astype(jnp.int32),
        }
        return TrainState(step, params, opt_state), metrics

    return jax.jit(
        train_step,
        in_shardings=(layout.state_shardings, layout.batch_sharding, layout.replicated),
        out_shardings=(layout.state_shardings, layout.replicated),
        donate_argnums=(0,),
    )


def make_eval_step(model: Model, layout: Layout) -> Callable[[Any, Batch], Metrics]:
    """Jitted metric sums for one batch (summed over batches, divided at the end)."""
    return jax.jit(
        model.loss_sums,
        in_shardings=(layout.state_shardings.params, layout.batch_sharding),
        out_shardings=layout.replicated,
    )
