"""Optimizers and learning-rate schedules from the papers, built on optax."""

from __future__ import annotations

import jax.numpy as jnp
import optax


def inverse_sqrt_schedule(warmup_steps: int = 10_000, scale: float = 1.0) -> optax.Schedule:
    """T5 pretraining: scale / sqrt(max(step, warmup_steps)).

    Constant scale/sqrt(warmup) (0.01 for 10^4) during warm-up, then decaying as 1/sqrt(step).
    """

    def schedule(step):
        return scale * jnp.reciprocal(jnp.sqrt(jnp.maximum(step, warmup_steps).astype(jnp.float32)))

    return schedule


def t5_adafactor(learning_rate: optax.ScalarOrSchedule) -> optax.GradientTransformation:
    """Adafactor with Mesh-TF T5's settings: factored second moments for matrices, decay 0.8,
    update clipping at 1.0, updates scaled by each parameter's RMS, no momentum."""
    return optax.adafactor(
        learning_rate=learning_rate,
        min_dim_size_to_factor=128,
        decay_rate=0.8,
        decay_offset=0,
        multiply_by_parameter_scale=True,
        clipping_threshold=1.0,
        momentum=None,
        eps=1e-30,
        factored=True,
    )
