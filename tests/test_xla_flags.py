"""Importing t5x_like sets the CPU fusion flag the benchmarks measured, without overriding a
choice already made in XLA_FLAGS."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _flags_after_import(xla_flags: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if xla_flags is not None:
        env["XLA_FLAGS"] = xla_flags
    return subprocess.run(
        [sys.executable, "-c", "import os, t5x_like; print(os.environ['XLA_FLAGS'])"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout.strip()


def test_default_cpu_flag_is_added_to_existing_flags():
    assert _flags_after_import(None) == "--xla_cpu_experimental_ynn_fusion_type=dot"
    assert _flags_after_import("--xla_force_host_platform_device_count=2").split() == [
        "--xla_force_host_platform_device_count=2", "--xla_cpu_experimental_ynn_fusion_type=dot"]


def test_a_users_choice_wins():
    chosen = "--xla_cpu_experimental_ynn_fusion_type=default"
    assert _flags_after_import(chosen) == chosen


def test_the_flag_is_one_this_jax_accepts():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(
        [sys.executable, "-c", "import t5x_like, jax, jax.numpy as jnp; "
                               "print(float(jax.jit(lambda x: (x @ x).sum())(jnp.ones((4, 4)))))"],
        cwd=ROOT, env={**env, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True,
        check=True)
    assert out.stdout.strip().endswith("64.0")
