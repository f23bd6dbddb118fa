"""The CPU tuning is an explicit choice: it applies only where jax will run on the CPU, and
T5X_LIKE_CPU_TUNING=off leaves all of it out (process settings, sums as dots, product layouts),
so the plain jax ops run. The plain ops are the truth the tuned ones are compared with:
gradients through `einsum_with_cpu_gradients` equal autodiff's of `jnp.einsum`."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like import host_runtime, products

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize(
    "platforms, plugin, expected",
    [
        ("cpu", "libtpu", False),
        ("tpu", None, True),
        ("cuda,cpu", None, True),
        ("", "libtpu", True),
        ("", "jax_cuda12_plugin", True),
        ("", None, False),
    ],
)
def test_an_accelerator_is_expected_from_jax_platforms_or_an_installed_plugin(
    platforms, plugin, expected, monkeypatch
):
    monkeypatch.setenv("JAX_PLATFORMS", platforms)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: (
            (object() if name == plugin else None)
            if name in host_runtime.ACCELERATOR_PLUGINS
            else real_find_spec(name, *a)
        ),
    )
    assert host_runtime.accelerator_expected() is expected


_PROBE = """
import json, os
import t5x_like
from t5x_like import host_runtime, products, reductions
print(json.dumps({"applied": host_runtime.applied_settings,
                  "xla_flags": os.environ.get("XLA_FLAGS", ""),
                  "sums_as_dots": reductions.sums_as_dots(),
                  "layouts": products.contraction_layouts()}))
"""


def _probe(**env: str) -> dict:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k
        not in ("XLA_FLAGS", "JAX_PLATFORMS", host_runtime.CPU_TUNING_ENV, host_runtime.MALLOC_ENV)
    }
    done = subprocess.run(
        [sys.executable, "-c", _PROBE],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_cpu_process_gets_the_tuning_and_off_leaves_it_out():
    tuned = _probe(JAX_PLATFORMS="cpu")
    assert "xla_cpu_flags" in tuned["applied"] and "keep_freed_memory" in tuned["applied"]
    assert "--xla_cpu_experimental_ynn_fusion_type=dot" in tuned["xla_flags"]
    assert tuned["sums_as_dots"] and tuned["layouts"]

    plain = _probe(JAX_PLATFORMS="cpu", T5X_LIKE_CPU_TUNING="off")
    assert plain == {"applied": [], "xla_flags": "", "sums_as_dots": False, "layouts": False}


def _grads(fn, a, b):
    return jax.grad(lambda a, b: jnp.sum(jnp.sin(fn(a, b))), argnums=(0, 1))(a, b)


@pytest.mark.parametrize("layouts", [True, False], ids=["cpu-layouts", "plain"])
def test_products_equal_autodiff_of_the_plain_einsum(layouts, monkeypatch):
    monkeypatch.setattr(products, "contraction_layouts", lambda: layouts)
    spec = "bhqk,bhkd->bhqd"
    a = jax.random.normal(jax.random.key(0), (2, 3, 5, 7))
    b = jax.random.normal(jax.random.key(1), (2, 3, 7, 4))
    tuned = products.einsum_with_cpu_gradients(spec)
    jaxpr = str(jax.make_jaxpr(lambda a, b: _grads(tuned, a, b))(a, b))
    # the CPU backward copies operands into YNNPACK's layout behind optimization barriers;
    # the plain path is autodiff of jax's own einsum, without them
    assert ("optimization_barrier" in jaxpr) is layouts
    want = _grads(lambda a, b: jnp.einsum(spec, a, b), a, b)
    for got, ref in zip(_grads(tuned, a, b), want, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)  # float32 summation order
