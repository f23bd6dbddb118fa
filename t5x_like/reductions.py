"""Sums written so that XLA's CPU backend runs them fast, and exactly as sums elsewhere.

XLA CPU hands matrix products to YNNPACK but emits reductions as its own loops, and two
shapes of reduction are slow there: whole-array sums (split into two-stage `reduce-window`
loops, about half as fast as a dot) and, far worse, sums over *leading* axes that keep a
large trailing block, such as the relative-position bias gradient's sum over the batch of a
(batch, heads, 512, 512) array: each output element reads one value per batch row, rows
megabytes apart, and the loop ran at ~0.3 GB/s (111 ms where the same sum as a
matrix-vector product with a vector of ones takes 2 ms; benchmarks/HISTORY.md, part 5).

On TPU and GPU reductions are fast, and a float32 dot at default precision would round its
inputs (bfloat16 passes, TF32), so there the plain reduction is kept. The dots here use
HIGHEST precision and float32 accumulation, so on CPU they are float32 sums too (the order of
the additions differs, nothing else).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from t5x_like import host_runtime

Array = jax.Array


def sums_as_dots() -> bool:
    """Whether to write sums as matrix products: only on XLA's CPU backend (see above), and
    not with T5X_LIKE_CPU_TUNING=off (`host_runtime.cpu_tuning_enabled`)."""
    return jax.default_backend() == "cpu" and host_runtime.cpu_tuning_enabled()


def sum_of_squares(x: Array, as_dot: bool) -> Array:
    """sum(x**2) in float32, as a dot of `x` with itself when `as_dot`."""
    if as_dot:
        flat = x.reshape(-1)
        return jnp.vdot(
            flat, flat, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32
        )
    return jnp.sum(jnp.square(x.astype(jnp.float32)))


def sum_to_shape(x: Array, shape: tuple[int, ...]) -> Array:
    """Sum `x` down to `shape` under numpy broadcasting (axes `shape` lacks or has as 1): the
    gradient of a tensor of `shape` broadcast to `x.shape`. When the summed axes lead (a bias
    shared over the batch, or over batch and length), on CPU the sum is a vector of ones times
    `x` viewed as (leading, rest); otherwise a plain `jnp.sum`."""
    if len(shape) > x.ndim:
        raise ValueError(f"cannot sum {x.shape} to the larger rank of {shape}")
    padded = (1,) * (x.ndim - len(shape)) + tuple(shape)
    axes = tuple(i for i, (n, m) in enumerate(zip(x.shape, padded)) if m == 1 and n != 1)
    if not axes:
        return x.reshape(shape)
    if not (axes == tuple(range(len(axes))) and sums_as_dots()):
        return jnp.sum(x, axis=axes, keepdims=True).reshape(shape)
    rows = math.prod(x.shape[: len(axes)])
    ones = jnp.ones((rows,), x.dtype)
    total = jnp.matmul(
        ones,
        x.reshape(rows, -1),
        precision=jax.lax.Precision.HIGHEST,
        preferred_element_type=jnp.float32,
    )
    return total.astype(x.dtype).reshape(shape)
