"""Optimizers and learning-rate schedules from the papers, built on optax."""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax

from t5x_like import reductions


def inverse_sqrt_schedule(warmup_steps: int = 10_000, scale: float = 1.0) -> optax.Schedule:
    """T5 pretraining: scale / sqrt(max(step, warmup_steps)).

    Constant scale/sqrt(warmup) (0.01 for 10^4) during warm-up, then decaying as 1/sqrt(step).
    """

    def schedule(step):
        return scale * jnp.reciprocal(jnp.sqrt(jnp.maximum(step, warmup_steps).astype(jnp.float32)))

    return schedule


def matrix_view(shape: tuple[int, ...]) -> tuple[int, int] | None:
    """The most balanced 2-D view of a >2-D shape (split where min(rows, cols) is largest).

    Mesh-TF T5 stores attention kernels as [d_model, heads * d_kv] matrices; ours keep heads and
    d_kv apart for sharding, (embed, heads, kv) and (heads, kv, embed). Their balanced view is
    exactly the Mesh-TF matrix, so Adafactor factors them as T5 did.
    """
    if len(shape) < 3:
        return None
    splits = [(int(np.prod(shape[:k])), int(np.prod(shape[k:]))) for k in range(1, len(shape))]
    return max(splits, key=min)


class _MatrixViewState(NamedTuple):
    inner: optax.OptState


def factor_as_matrices(inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """Run `inner` on the 2-D views of >2-D parameters (see `matrix_view`), then reshape back.

    optax's Adafactor factors the two largest dims of a tensor; on (768, 12, 64) that is
    768 x 64, and 64 is below its factoring threshold, so T5's attention kernels would keep full
    second moments. On the matrix view they are factored, as in the paper's code.
    """

    def to_matrices(tree):
        return jax.tree_util.tree_map(
            lambda x: x.reshape(matrix_view(x.shape)) if matrix_view(x.shape) else x, tree
        )

    def init(params):
        return _MatrixViewState(inner.init(to_matrices(params)))

    def update(updates, state, params=None):
        new, inner_state = inner.update(
            to_matrices(updates), state.inner, None if params is None else to_matrices(params)
        )
        new = jax.tree_util.tree_map(lambda u, like: u.reshape(like.shape), new, updates)
        return new, _MatrixViewState(inner_state)

    return optax.GradientTransformation(init, update)


_T5_ADAFACTOR = dict(
    min_dim_size_to_factor=128,
    decay_rate=0.8,
    decay_offset=0,
    multiply_by_parameter_scale=True,
    clipping_threshold=1.0,
    momentum=None,
    eps=1e-30,
    factored=True,
)


def optax_t5_adafactor(learning_rate: optax.ScalarOrSchedule) -> optax.GradientTransformation:
    """T5's Adafactor as optax composes it (on the matrix views): the reference that
    `t5_adafactor` computes in fewer passes, and the definition of its state."""
    return factor_as_matrices(optax.adafactor(learning_rate=learning_rate, **_T5_ADAFACTOR))


def t5_adafactor(learning_rate: optax.ScalarOrSchedule) -> optax.GradientTransformation:
    """Adafactor with Mesh-TF T5's settings: factored second moments for matrices (attention
    kernels viewed as the [d_model, heads * d_kv] matrices T5 had), decay 0.8, update clipping
    at 1.0, updates scaled by each parameter's RMS, no momentum.

    The same update and the same state (checkpoints are interchangeable) as
    `optax_t5_adafactor`, computed per parameter in one expression instead of a chain of five
    transforms (XLA fuses it into fewer passes over the parameters), and on CPU with the sums
    as matrix-vector products (see `t5x_like.reductions`): the standard benchmark config's
    update with the step's two norm metrics measured 201-236 ms with optax's composition and
    144-151 ms this way on 2 CPU cores (benchmarks/HISTORY.md).
    """
    reference = optax_t5_adafactor(learning_rate)

    def update(updates, state, params=None):
        if params is None:
            raise ValueError(
                "t5_adafactor scales updates by each parameter's RMS: call "
                "update(grads, state, params) with the parameters."
            )
        return _t5_adafactor_update(
            learning_rate, updates, state, params, reductions.sums_as_dots()
        )

    return optax.GradientTransformation(reference.init, update)


def global_norm(tree) -> jax.Array:
    """optax.global_norm (the L2 norm of all leaves together), with the sums as dots on CPU."""
    as_dot = reductions.sums_as_dots()
    return jnp.sqrt(
        sum(reductions.sum_of_squares(x, as_dot) for x in jax.tree_util.tree_leaves(tree))
    )


def _factored_axes(shape: tuple[int, ...]) -> tuple[int, int] | None:
    """optax Adafactor's choice: (second largest, largest) axis of a 2-D or larger shape,
    factored when the second largest has at least `min_dim_size_to_factor` entries."""
    if len(shape) < 2:
        return None
    small, large = (int(i) for i in np.argsort(shape)[-2:])
    return (small, large) if shape[small] >= _T5_ADAFACTOR["min_dim_size_to_factor"] else None


def _t5_adafactor_update(learning_rate, grads, state, params, sums_as_dots: bool):
    """One Adafactor step for every parameter, in `optax_t5_adafactor`'s state layout:
    (factored second moments, block-RMS clipping, learning rate, parameter scale, sign)."""
    moments, clip_state, lr_state, *rest = state.inner
    count = moments.count
    # optax's decay schedule 1 - (t + 1)^-0.8 with decay_offset 0.
    decay = 1.0 - jnp.asarray(count + 1, jnp.float32) ** -_T5_ADAFACTOR["decay_rate"]
    if callable(learning_rate):
        lr, lr_state = (
            learning_rate(lr_state.count),
            lr_state._replace(count=optax.safe_increment(lr_state.count)),
        )
    else:
        lr = learning_rate
    eps = _T5_ADAFACTOR["eps"]
    treedef = jax.tree_util.tree_structure(grads)
    leaves = [
        treedef.flatten_up_to(t) for t in (grads, params, moments.v_row, moments.v_col, moments.v)
    ]

    def one(g, p, v_row, v_col, v):
        shape = g.shape
        if matrix_view(shape):
            g, p = g.reshape(matrix_view(shape)), p.reshape(matrix_view(shape))
        axes = _factored_axes(g.shape)
        if axes is None:
            v = decay * v + (1.0 - decay) * (jnp.square(g) + eps)
            v = v.astype(p.dtype)
            u = g * jax.lax.rsqrt(v)
            u_squares = reductions.sum_of_squares(u, sums_as_dots)
        else:
            small, large = axes
            row_mean, col_mean, u_squares_of = _factored_moments(g, small, large, sums_as_dots)
            v_row = (decay * v_row + (1.0 - decay) * (row_mean + eps)).astype(p.dtype)
            v_col = (decay * v_col + (1.0 - decay) * (col_mean + eps)).astype(p.dtype)
            row_factor = jax.lax.rsqrt(v_row / jnp.mean(v_row))
            col_factor = jax.lax.rsqrt(v_col)
            u = g * jnp.expand_dims(row_factor, large) * jnp.expand_dims(col_factor, small)
            u_squares = u_squares_of(row_factor, col_factor)
        clip = jnp.maximum(1.0, jnp.sqrt(u_squares / u.size) / _T5_ADAFACTOR["clipping_threshold"])
        p_squares = reductions.sum_of_squares(p, sums_as_dots)
        param_scale = jnp.maximum(jnp.sqrt(p_squares / p.size), 1e-3)
        update = -(lr * param_scale / clip) * u
        return update.reshape(shape).astype(p.dtype), v_row, v_col, v

    results = [one(*args) for args in zip(*leaves)]
    updates, v_row, v_col, v = (treedef.unflatten(list(r)) for r in zip(*results))
    moments = moments._replace(count=optax.safe_increment(count), v_row=v_row, v_col=v_col, v=v)
    return updates, _MatrixViewState((moments, clip_state, lr_state, *rest))


def _factored_moments(g: jax.Array, small: int, large: int, as_dots: bool):
    """Means of g**2 over the `large` and the `small` axis of a matrix, and a function giving
    sum(u**2) for u = g * row_factor (a vector along the `small` axis) * col_factor (along
    `large`), which as dots needs no pass over u: sum_ij g_ij**2 a_i b_j = a . (g**2 b)."""
    if not as_dots:
        square = jnp.square(g)
        return (
            jnp.mean(square, axis=large),
            jnp.mean(square, axis=small),
            lambda rf, cf: jnp.sum(
                jnp.square(g * jnp.expand_dims(rf, large) * jnp.expand_dims(cf, small))
            ),
        )
    square = jnp.square(g)
    dot = functools.partial(jnp.dot, precision=jax.lax.Precision.HIGHEST)
    rows, cols = square.shape
    sum_over_1, sum_over_0 = (
        dot(square, jnp.ones((cols,), g.dtype)),
        dot(jnp.ones((rows,), g.dtype), square),
    )
    sums = {0: sum_over_0, 1: sum_over_1}

    def u_squares(row_factor, col_factor):
        # row_factor runs along the `small` axis (it was averaged over `large`), col_factor
        # along `large`.
        along = {small: jnp.square(row_factor), large: jnp.square(col_factor)}
        return jnp.vdot(along[0], dot(square, along[1]), precision=jax.lax.Precision.HIGHEST)

    return sums[large] / g.shape[large], sums[small] / g.shape[small], u_squares


SCHEDULES = ("inverse_sqrt", "constant", "linear_decay", "cosine")
# A run names a schedule or an optimizer by string (`Schedule.kind='cosine'`,
# `Optimizer.kind='adamw'`) or binds a callable that builds one (`Optimizer.kind=
# @my_optimizer`, a gin configurable): a schedule factory gets the run's total steps, an
# optimizer factory the learning-rate schedule. A new one needs no edit of `train`.
ScheduleFactory = Callable[[int], optax.Schedule]
OptimizerFactory = Callable[[optax.Schedule], optax.GradientTransformation]


def learning_rate_schedule(
    name: str | ScheduleFactory = "inverse_sqrt",
    warmup_steps: int = 10_000,
    scale: float = 1.0,
    constant: float = 0.001,
    peak: float = 1e-4,
    total_steps: int = 1_000_000,
) -> optax.Schedule:
    """T5's two schedules, pretraining's 1/sqrt(max(step, k)) and fine-tuning's constant 0.001
    (section 3.1.2), BERT's (and GPT-1 fine-tuning's) linear warm-up to `peak` then linear
    decay to 0 at `total_steps` ('linear_decay'), and GPT-1 pretraining's linear warm-up then
    cosine annealing to 0 ('cosine'). A callable `name` is a schedule factory: it is given
    `total_steps` and its other settings come from gin."""
    if callable(name):
        return name(total_steps)
    if name == "inverse_sqrt":
        return inverse_sqrt_schedule(warmup_steps, scale)
    if name == "constant":
        return optax.constant_schedule(constant)
    if name == "linear_decay":
        return bert_learning_rate(peak, total_steps, warmup_steps)
    if name == "cosine":  # GPT-1 pretraining: linear warm-up to `peak`, cosine anneal to 0
        return optax.warmup_cosine_decay_schedule(
            0.0, peak, max(warmup_steps, 1), max(total_steps, warmup_steps + 1), 0.0
        )
    from t5x_like.errors import ConfigError

    raise ConfigError(f"Schedule.kind={name!r}; choose one of {SCHEDULES}.")


OPTIMIZERS = ("adafactor", "adamw")


def optimizer_factory(name: str | OptimizerFactory) -> OptimizerFactory:
    """The factory a run's `optimizer` setting names: T5's Adafactor ('adafactor'), BERT's
    AdamW ('adamw', settings from gin: `bert_adamw.weight_decay`, ...), or the callable
    itself."""
    if callable(name):
        return name
    named: dict[str, OptimizerFactory] = {"adafactor": t5_adafactor, "adamw": bert_adamw}
    if name not in named:
        from t5x_like.errors import ConfigError

        raise ConfigError(
            f"Optimizer.kind={name!r}; choose one of {OPTIMIZERS}, or bind a callable that "
            "builds an optax optimizer from the learning-rate schedule "
            "(--gin.Optimizer.kind=@my_optimizer)."
        )
    return named[name]


def make_optimizer(
    name: str | OptimizerFactory,
    learning_rate: optax.Schedule,
    frozen_modules: Sequence[str] = (),
) -> optax.GradientTransformation:
    """The run's optimizer (`optimizer_factory`) on `learning_rate`. Top-level modules named
    in `frozen_modules` get no update at all (no weight decay either, and no optimizer state):
    BERT's feature-based approach."""
    tx = optimizer_factory(name)(learning_rate)
    if not frozen_modules:
        return tx

    def labels(params):
        return {
            k: jax.tree_util.tree_map(
                lambda _, k=k: "frozen" if k in frozen_modules else "trained", v
            )
            for k, v in params.items()
        }

    return optax.multi_transform({"trained": tx, "frozen": optax.set_to_zero()}, labels)


# ------------------------------------------------------------------------------ BERT
def bert_learning_rate(
    peak: float = 1e-4, total_steps: int = 1_000_000, warmup_steps: int = 10_000
) -> optax.Schedule:
    """BERT's schedule as its code computes it: peak * (1 - step / total) (linear decay to 0
    over the whole run), replaced by the linear warm-up peak * step / warmup for
    step < warmup."""

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        decay = peak * jnp.maximum(0.0, 1.0 - step / total_steps)
        warm = peak * step / max(warmup_steps, 1)
        return jnp.where(step < warmup_steps, warm, decay)

    return schedule


def no_decay_on_norms_and_biases(params) -> object:
    """True where weight decay applies: every parameter except biases and LayerNorm scales and
    biases (BERT excludes "LayerNorm" and "bias")."""

    def decays(path, _):
        names = [str(getattr(k, "key", k)) for k in path]
        in_norm = any(n.endswith("norm") for n in names[:-1])
        return not (in_norm or "bias" in names[-1])

    return jax.tree_util.tree_map_with_path(decays, params)


@gin.configurable(denylist=["learning_rate"])
def bert_adamw(
    learning_rate: optax.ScalarOrSchedule,
    weight_decay: float = 0.01,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
    clip_norm: float | None = 1.0,
) -> optax.GradientTransformation:
    """BERT's optimizer: gradients clipped to global norm 1.0, then Adam (beta1 0.9, beta2
    0.999) with weight decay 0.01 decoupled from the gradient and skipped for LayerNorm and
    biases. Adam here is the paper's, with bias correction (as transformers' AdamW); BERT's
    released TF code left the correction out, which only changes the first few hundred
    steps, inside the warm-up."""
    steps = [optax.clip_by_global_norm(clip_norm)] if clip_norm else []
    steps += [
        optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
        optax.add_decayed_weights(weight_decay, mask=no_decay_on_norms_and_biases),
        optax.scale_by_learning_rate(learning_rate),
    ]
    return optax.chain(*steps)
