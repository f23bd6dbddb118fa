"""`t5x_like.products`: products laid out for XLA CPU's YNNPACK kernel give the same values and
gradients as plain einsums (numpy in float64, jax's autodiff), and on CPU every product of a
T5 train step compiles to a YNNPACK fusion, where autodiff's gradients leave some to Eigen."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like import products
from tests.test_donation import compile_tiny_t5_step

# (spec, lhs shape, rhs shape): the attention's two products and a dense layer's.
SPECS = [
    ("bqhd,bkhd->bhqk", (2, 16, 3, 8), (2, 12, 3, 8)),
    ("bhqk,bkhd->bqhd", (2, 3, 16, 12), (2, 12, 3, 8)),
    ("ni,io->no", (20, 8), (8, 24)),
]


def _operands(lhs_shape, rhs_shape, dtype=jnp.float32):
    k1, k2 = jax.random.split(jax.random.key(0))
    return (jax.random.normal(k1, lhs_shape, dtype), jax.random.normal(k2, rhs_shape, dtype))


@pytest.mark.parametrize("spec", ["bhqk,bqhd->bkhd", "ni,no->io", "bhqk,bkhd->bqhd"])
def test_einsum_equals_numpy_for_any_contraction_layout(spec):
    """The key/value-gradient form (query axis contracted in both), the weight-gradient form
    (rows contracted in both) and one that needs no rewriting."""
    lhs_labels, rhs_labels = spec.split("->")[0].split(",")
    sizes = {"b": 2, "h": 3, "q": 16, "k": 12, "d": 8, "n": 20, "i": 8, "o": 24}
    a, b = _operands(tuple(sizes[c] for c in lhs_labels), tuple(sizes[c] for c in rhs_labels))
    expected = np.einsum(spec, np.float64(a), np.float64(b))
    np.testing.assert_allclose(
        jax.jit(lambda x, y: products.einsum(spec, x, y))(a, b), expected, rtol=1e-5, atol=1e-5
    )


def _loss(product):
    return lambda a, b: jnp.sum(jnp.sin(product(a, b)))


@pytest.mark.parametrize("spec,lhs_shape,rhs_shape", SPECS)
def test_values_and_gradients_equal_autodiff_of_the_plain_einsum(spec, lhs_shape, rhs_shape):
    a, b = _operands(lhs_shape, rhs_shape)
    fast = products.einsum_with_cpu_gradients(spec)
    np.testing.assert_allclose(fast(a, b), jnp.einsum(spec, a, b), rtol=1e-6)
    ours = jax.jit(jax.grad(_loss(fast), argnums=(0, 1)))(a, b)
    plain = jax.jit(jax.grad(_loss(lambda x, y: jnp.einsum(spec, x, y)), argnums=(0, 1)))(a, b)
    for got, want in zip(ours, plain):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_gradients_keep_each_operands_dtype():
    a, b = _operands((2, 3, 16, 12), (2, 12, 3, 8), jnp.bfloat16)
    grads = jax.grad(_loss(products.einsum_with_cpu_gradients("bhqk,bkhd->bqhd")), argnums=(0, 1))(
        a, b
    )
    assert [g.dtype for g in grads] == [jnp.bfloat16, jnp.bfloat16]


def _products_outside_ynnpack(monkeypatch, layouts: bool) -> list[str]:
    """The matrix products of a small T5's compiled train step that XLA runs itself (Eigen's
    generic dot in the entry computation, not a YNNPACK fusion), leaving out the sums written
    as HIGHEST-precision dots (`reductions`, memory-bound matrix-vector products)."""
    monkeypatch.setattr(products, "contraction_layouts", lambda: layouts)
    hlo = compile_tiny_t5_step()[2].as_text()
    entry = hlo[hlo.index("ENTRY") :].splitlines()
    return [
        line.split(", metadata")[0].strip()
        for line in entry
        if re.search(r"= f32\[[\d,]*\]\S* dot\(", line) and "highest" not in line
    ]


def test_on_cpu_every_product_of_the_train_step_runs_in_ynnpack(monkeypatch):
    assert jax.default_backend() == "cpu" and products.contraction_layouts()
    # Autodiff's own gradients leave XLA the products that contract non-minor dims of both
    # operands: the weight gradients and attention's key and value gradients.
    autodiff = _products_outside_ynnpack(monkeypatch, layouts=False)
    assert any("lhs_contracting_dims={0}" in line for line in autodiff)  # weight gradients
    assert any("lhs_contracting_dims={2}" in line for line in autodiff)  # key / value
    assert _products_outside_ynnpack(monkeypatch, layouts=True) == []


@pytest.mark.parametrize("spec", ["bqhd,bkhd->bhqkx", "bqq,bqd->bd", "bq,bk->bqx", "bq,bk->b"])
def test_unsupported_specs_are_refused(spec):
    with pytest.raises(ValueError):
        products.einsum_with_cpu_gradients(spec)
