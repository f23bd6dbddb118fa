"""Optimizers and learning-rate schedules from the papers, built on optax."""

from __future__ import annotations

from typing import NamedTuple, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax


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
            lambda x: x.reshape(matrix_view(x.shape)) if matrix_view(x.shape) else x, tree)

    def init(params):
        return _MatrixViewState(inner.init(to_matrices(params)))

    def update(updates, state, params=None):
        new, inner_state = inner.update(to_matrices(updates), state.inner,
                                        None if params is None else to_matrices(params))
        new = jax.tree_util.tree_map(lambda u, like: u.reshape(like.shape), new, updates)
        return new, _MatrixViewState(inner_state)

    return optax.GradientTransformation(init, update)


def t5_adafactor(learning_rate: optax.ScalarOrSchedule) -> optax.GradientTransformation:
    """Adafactor with Mesh-TF T5's settings: factored second moments for matrices (attention
    kernels viewed as the [d_model, heads * d_kv] matrices T5 had), decay 0.8, update clipping
    at 1.0, updates scaled by each parameter's RMS, no momentum."""
    return factor_as_matrices(optax.adafactor(
        learning_rate=learning_rate,
        min_dim_size_to_factor=128,
        decay_rate=0.8,
        decay_offset=0,
        multiply_by_parameter_scale=True,
        clipping_threshold=1.0,
        momentum=None,
        eps=1e-30,
        factored=True,
    ))


SCHEDULES = ("inverse_sqrt", "constant", "linear_decay", "cosine")


def learning_rate_schedule(name: str = "inverse_sqrt", warmup_steps: int = 10_000,
                           scale: float = 1.0, constant: float = 0.001, peak: float = 1e-4,
                           total_steps: int = 1_000_000) -> optax.Schedule:
    """T5's two schedules, pretraining's 1/sqrt(max(step, k)) and fine-tuning's constant 0.001
    (section 3.1.2), BERT's (and GPT-1 fine-tuning's) linear warm-up to `peak` then linear
    decay to 0 at `total_steps` ('linear_decay'), and GPT-1 pretraining's linear warm-up then
    cosine annealing to 0 ('cosine')."""
    if name == "inverse_sqrt":
        return inverse_sqrt_schedule(warmup_steps, scale)
    if name == "constant":
        return optax.constant_schedule(constant)
    if name == "linear_decay":
        return bert_learning_rate(peak, total_steps, warmup_steps)
    if name == "cosine":  # GPT-1 pretraining: linear warm-up to `peak`, cosine anneal to 0
        return optax.warmup_cosine_decay_schedule(0.0, peak, max(warmup_steps, 1),
                                                  max(total_steps, warmup_steps + 1), 0.0)
    from t5x_like.config import ConfigError

    raise ConfigError(f"train.learning_rate_schedule={name!r}; choose one of {SCHEDULES}.")


OPTIMIZERS = ("adafactor", "adamw")


def make_optimizer(name: str, learning_rate: optax.Schedule,
                   frozen_modules: Sequence[str] = ()) -> optax.GradientTransformation:
    """T5's Adafactor or BERT's AdamW (settings from gin: `bert_adamw.weight_decay`, ...).
    Top-level modules named in `frozen_modules` get no update at all (no weight decay either,
    and no optimizer state): BERT's feature-based approach."""
    if name == "adafactor":
        tx = t5_adafactor(learning_rate)
    elif name == "adamw":
        tx = bert_adamw(learning_rate)
    else:
        from t5x_like.config import ConfigError

        raise ConfigError(f"train.optimizer={name!r}; choose one of {OPTIMIZERS}.")
    if not frozen_modules:
        return tx

    def labels(params):
        return {k: jax.tree_util.tree_map(lambda _, k=k: "frozen" if k in frozen_modules
                                          else "trained", v) for k, v in params.items()}

    return optax.multi_transform({"trained": tx, "frozen": optax.set_to_zero()}, labels)


# ------------------------------------------------------------------------------ BERT
def bert_learning_rate(peak: float = 1e-4, total_steps: int = 1_000_000,
                       warmup_steps: int = 10_000) -> optax.Schedule:
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
def bert_adamw(learning_rate: optax.ScalarOrSchedule, weight_decay: float = 0.01,
               b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
               clip_norm: float | None = 1.0) -> optax.GradientTransformation:
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
