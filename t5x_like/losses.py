"""Cross-entropy with T5's options: label smoothing, z-loss and loss normalisation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def cross_entropy_with_logits(logits: Array, targets: Array, weights: Array | None = None,
                              label_smoothing: float = 0.0,
                              z_loss: float = 0.0) -> tuple[Array, Array]:
    """Per-token cross-entropy (float32) and the z-loss part of it.

    z-loss adds `z_loss * logsumexp(logits)^2`, which keeps the softmax normaliser near 1 (used
    by Mesh-TF T5 with 1e-4). Label smoothing spreads `label_smoothing` of the target mass
    uniformly over the other tokens and subtracts the entropy of that smoothed distribution, so
    a perfect prediction still scores zero.

    Returns (loss, z_loss_part), each shaped like `targets` and multiplied by `weights`.
    """
    logits = logits.astype(jnp.float32)
    vocab = logits.shape[-1]
    confidence = 1.0 - label_smoothing
    low = label_smoothing / (vocab - 1)
    normalizing_constant = -(
        confidence * np.log(confidence) + (vocab - 1) * low * np.log(low + 1e-20))
    soft_targets = jax.nn.one_hot(targets, vocab) * (confidence - low) + low
    log_z = jax.nn.logsumexp(logits, axis=-1)
    log_probs = logits - log_z[..., None]
    loss = -jnp.sum(soft_targets * log_probs, axis=-1) - normalizing_constant
    z_part = z_loss * jnp.square(log_z)
    loss = loss + z_part
    if weights is not None:
        loss = loss * weights
        z_part = z_part * weights
    return loss, z_part


def token_log_likelihood(logits: Array, targets: Array) -> Array:
    """log p(target) per position, float32."""
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]


def normalizing_factor(weight_sum: Array, loss_normalizing_factor: float | str | None) -> Array:
    """Divisor for the summed loss.

    'num_real_target_tokens' (default): `weight_sum`, the number of non-padding target tokens,
    so the loss is a per-token mean. A number: a constant, as Mesh-TF T5 used (e.g. 233472 = 2048 x 114) so
    that every token counts the same whatever the batch's padding. None: no normalisation.
    """
    if loss_normalizing_factor is None:
        return jnp.asarray(1.0, jnp.float32)
    if isinstance(loss_normalizing_factor, str):
        if loss_normalizing_factor != "num_real_target_tokens":
            raise ValueError(
                f"loss_normalizing_factor={loss_normalizing_factor!r}: use a number, None or "
                "'num_real_target_tokens'.")
        return jnp.maximum(jnp.asarray(weight_sum, jnp.float32), 1.0)
    return jnp.asarray(float(loss_normalizing_factor), jnp.float32)
