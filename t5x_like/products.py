"""Matrix products whose gradients XLA's CPU backend hands to its fast kernel.

XLA CPU runs a matrix product through YNNPACK only when the left operand's contracted dims
are its last (minor) dims; any other product goes to XLA's generic Eigen dot. Autodiff makes
such products in every backward pass: a weight gradient xᵀ·dy contracts the rows of both
operands, and attention's key and value gradients (dSᵀ·q, Pᵀ·dO) contract the query axis of
both. In the standard T5 step those ran at 60-160 GFLOP/s where the same products with the
contraction minor run at 150-200 (benchmarks/HISTORY.md, part 7): the (32 x 512 x 512)ᵀ ·
(512 x 64) value gradient 19 ms against 12 ms, the feed-forward weight gradient 19 ms
against 16 ms.

`einsum` writes such a product in the form YNNPACK takes: the smaller operand transposed
into (batch, free, contracted) order, the other in (batch, contracted, free) order, and the
result transposed back to the order asked for. The transposes are copies of the smaller
arrays; `lax.optimization_barrier` keeps XLA from folding them back into the product (its
transpose folding would recreate the form YNNPACK refuses). `einsum_with_cpu_gradients`
gives a two-operand einsum whose backward pass computes both cotangents with `einsum`.

Only on XLA's CPU backend (and not with T5X_LIKE_CPU_TUNING=off): TPU and GPU matrix units take
transposed operands at no cost, and the copies would only add memory traffic there, so there the
plain einsum runs, differentiated by autodiff. Values are the same products either way.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp

from t5x_like import reductions

Array = jax.Array


def contraction_layouts() -> bool:
    """Whether to lay products out for XLA's CPU kernel: on the CPU backend only, the rule
    `reductions` follows for its sums."""
    return reductions.sums_as_dots()


def _parse(spec: str) -> tuple[str, str, str]:
    inputs, out = spec.replace(" ", "").split("->")
    lhs, rhs = inputs.split(",")
    for labels in (lhs, rhs, out):
        if len(set(labels)) != len(labels) or not labels.isalpha():
            raise ValueError(f"{spec!r}: each operand needs distinct letter labels")
    if set(out) - set(lhs) - set(rhs) or (set(lhs) ^ set(rhs)) - set(out):
        raise ValueError(f"{spec!r}: every label must be in the output or in both operands")
    return lhs, rhs, out


def _contraction_is_minor(labels: str, contracted: str) -> bool:
    return set(labels[len(labels) - len(contracted) :]) == set(contracted)


def _materialise(x: Array, labels: str, order: str) -> Array:
    """`x` (dims named by `labels`) transposed into `order`, as a copy XLA keeps."""
    if labels == order:
        return x
    return jax.lax.optimization_barrier(jnp.transpose(x, [labels.index(c) for c in order]))


def einsum(spec: str, a: Array, b: Array) -> Array:
    """`jnp.einsum(spec, a, b)`; on CPU, a product whose contraction is minor in neither
    operand is computed in YNNPACK's form (module docstring)."""
    a_labels, b_labels, out = _parse(spec)
    contracted = "".join(c for c in a_labels if c in b_labels and c not in out)
    if (
        not contraction_layouts()
        or not contracted
        or _contraction_is_minor(a_labels, contracted)
        or _contraction_is_minor(b_labels, contracted)
    ):
        return jnp.einsum(spec, a, b)
    # The smaller operand is transposed to (batch, free, contracted) as the left operand;
    # the other goes right as (batch, contracted, free), often its order already (neither
    # operand's contraction is minor here, so (batch, free, contracted) is never it).
    (x, x_labels), (y, y_labels) = sorted(
        [(a, a_labels), (b, b_labels)], key=lambda pair: pair[0].size
    )
    batch = "".join(c for c in out if c in x_labels and c in y_labels)
    x_free = "".join(c for c in x_labels if c not in batch and c not in contracted)
    y_free = "".join(c for c in y_labels if c not in batch and c not in contracted)
    y_order = batch + contracted + y_free
    left = _materialise(x, x_labels, batch + x_free + contracted)
    right = _materialise(y, y_labels, y_order)
    canonical = batch + x_free + y_free
    product = jnp.einsum(f"{batch + x_free + contracted},{y_order}->{canonical}", left, right)
    if canonical == out:
        return product
    product = jax.lax.optimization_barrier(product)
    return jnp.transpose(product, [canonical.index(c) for c in out])


@functools.cache
def einsum_with_cpu_gradients(spec: str) -> Callable[[Array, Array], Array]:
    """A two-operand `jnp.einsum(spec, ...)` whose backward pass computes both operands'
    gradients with `einsum` above (autodiff's own would contract non-minor dims) where the
    products are laid out for the CPU (`contraction_layouts`); elsewhere the plain einsum,
    differentiated by autodiff. Decided when traced."""
    with_cpu_backward = _einsum_with_custom_backward(spec)

    def product(a: Array, b: Array) -> Array:
        if contraction_layouts():
            return with_cpu_backward(a, b)
        return jnp.einsum(spec, a, b)

    return product


@functools.cache
def _einsum_with_custom_backward(spec: str) -> Callable[[Array, Array], Array]:
    a_labels, b_labels, out = _parse(spec)

    @jax.custom_vjp
    def product(a: Array, b: Array) -> Array:
        return jnp.einsum(spec, a, b)

    def forward(a: Array, b: Array) -> tuple[Array, tuple[Array, Array]]:
        return jnp.einsum(spec, a, b), (a, b)

    def backward(saved: tuple[Array, Array], grad: Array) -> tuple[Array, Array]:
        a, b = saved
        grad_a = einsum(f"{out},{b_labels}->{a_labels}", grad, b)
        grad_b = einsum(f"{a_labels},{out}->{b_labels}", a, grad)
        return grad_a.astype(a.dtype), grad_b.astype(b.dtype)

    product.defvjp(forward, backward)
    return product
