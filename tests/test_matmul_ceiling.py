"""The matmul-ceiling benchmark finds every product a computation runs, counts it as often as
it runs, and adds up stand-alone times into the MFU a step of nothing but products would
reach."""

import json

import jax
import jax.numpy as jnp

from benchmarks import matmul_ceiling
from tests.test_benchmark import TINY_T5

X = jnp.ones((4, 8))
W = jnp.ones((8, 8))
SQUARE = matmul_ceiling.Product(
    (4, 8), (8, 8), "float32", "float32", (((1,), (0,)), ((), ())), preferred_element_type="float32"
)


def test_scanned_products_count_once_per_iteration():
    """x @ w inside a 3-step scan is 3 products of 2*4*8*8 = 512 FLOPs; the batched einsum
    after it (1 x 4x8 by 1 x 8x4) is 2*4*8*4 = 256."""

    def f(x, w):
        h, _ = jax.lax.scan(lambda h, _: (h @ w, None), x, None, length=3)
        return jnp.einsum("bij,bjk->bik", h[None], h.T[None])

    census = matmul_ceiling.census_of(f, X, W)
    assert census.counts[SQUARE] == 3
    assert sum(census.counts.values()) == 4
    assert census.flops == 3 * 512 + 256
    assert census.while_loops == 0


def test_a_cond_counts_its_costliest_branch_and_a_gradient_its_backward_products():
    def f(p, x, w):
        return jax.lax.cond(p, lambda: x @ w, lambda: x @ w @ w)

    census = matmul_ceiling.census_of(f, True, X, W)
    assert census.counts[SQUARE] == 2 and census.flops == 2 * 512
    # d/dw sum(x @ w) = x^T @ ones: the forward product and one backward product
    # (contracting the 4 rows: 2*8*4*8 = 512 FLOPs; no gradient for x is asked for).
    grad = matmul_ceiling.census_of(jax.grad(lambda w: jnp.sum(X @ w)), W)
    assert sum(grad.counts.values()) == 2 and grad.flops == 2 * 512


def test_ceiling_adds_each_products_time_times_its_count():
    """Hand-computed: A runs twice (1 s at library 'a', 2 s at 'b'), B once (3 s, 1 s). At
    'a': 2*1 + 3 = 5 s; best per product: 2*1 + 1 = 3 s. 30 model FLOPs at peak 2 FLOP/s:
    MFUs 30/5/2 = 3 and 30/3/2 = 5."""
    other = matmul_ceiling.Product((8, 4), (4, 8), "float32", "float32", (((1,), (0,)), ((), ())))
    census = matmul_ceiling.Census()
    census.counts.update({SQUARE: 2, other: 1})
    timed = {SQUARE: {"a": 1.0, "b": 2.0}, other: {"a": 3.0, "b": 1.0}}
    assert matmul_ceiling.ceiling(census, timed, "a", 30.0, 2.0) == {
        "matmul_s_step_library": 5.0,
        "matmul_s_best_library": 3.0,
        "ceiling_mfu_step_library": 3.0,
        "ceiling_mfu_best_library": 5.0,
    }


def test_stand_alone_product_computes_the_product():
    fn, (a_spec, b_spec) = SQUARE.call()
    a = jnp.arange(32.0).reshape(a_spec.shape)
    b = jnp.arange(64.0).reshape(b_spec.shape) / 64
    assert jnp.allclose(fn(a, b), a @ b)


def test_benchmark_takes_the_train_step_apart(tmp_path):
    out = tmp_path / "ceiling.json"
    result = matmul_ceiling.main(
        TINY_T5
        + [
            "--batch",
            "8",
            "--inputs",
            "32",
            "--targets",
            "16",
            "--reps",
            "2",
            "--peak_size",
            "256",
            "--out",
            str(out),
        ]
    )
    assert json.loads(out.read_text())["product_flops"] == result["product_flops"]
    # Every matmul `t5x_like.flops` counts by hand is among the step's products; the rest are
    # vector products (sums written as dots, the optimizer's factored statistics).
    assert result["model_flops"] <= result["product_flops"] <= 1.05 * result["model_flops"]
    assert result["product_calls"] == sum(row["count"] for row in result["rows"])
    assert result["matmul_s_best_library"] <= result["matmul_s_step_library"]
    assert result["ceiling_mfu_best_library"] >= result["ceiling_mfu_step_library"] > 0
    first = [row["seconds"][result["step_library"]] for row in result["rows"]]
    assert first == sorted(first, reverse=True)
