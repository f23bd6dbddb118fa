"""`reductions.sum_to_shape` is the gradient of a broadcast (numpy's rules), whether it runs as
XLA's reduction or, on CPU, as a product with a vector of ones; checked against numpy's sums in
float64."""

import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like import reductions

CASES = [  # x shape, target shape, the axes numpy sums
    ((4, 3, 5, 6), (1, 3, 5, 6), (0,)),  # a bias shared over the batch (T5's relative bias)
    ((4, 3, 6), (6,), (0, 1)),  # a vector over batch and positions (BERT's output bias)
    ((4, 3, 6), (1, 1, 6), (0, 1)),
    ((4, 3, 6), (4, 1, 6), (1,)),  # not leading: always a reduction
    ((4, 3, 6), (1, 3, 1), (0, 2)),
    ((4, 3, 6), (4, 3, 6), ()),
]


@pytest.mark.parametrize("as_dots", [True, False], ids=["dots", "reduction"])
@pytest.mark.parametrize("x_shape,shape,axes", CASES)
def test_sum_to_shape_is_the_broadcast_gradient(x_shape, shape, axes, as_dots, monkeypatch):
    monkeypatch.setattr(reductions, "sums_as_dots", lambda: as_dots)
    x = np.random.default_rng(0).normal(size=x_shape).astype(np.float32)
    got = reductions.sum_to_shape(jnp.asarray(x), shape)
    want = x.astype(np.float64).sum(axis=axes, keepdims=True).reshape(shape)
    assert got.shape == shape and got.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)


def test_sum_to_shape_refuses_a_larger_rank():
    with pytest.raises(ValueError, match="larger rank"):
        reductions.sum_to_shape(jnp.zeros((3, 4)), (1, 3, 4))
