"""Peak FLOP/s of the hardware a run is on, the denominator of model-FLOPs utilisation (MFU).

Accelerators: the vendor's dense bfloat16 peak per jax device (a TPU v3 exposes each of its two
TensorCores as a device; v4 and v5p chips are one "megacore" device each). CPUs have no
published figure that means anything for XLA, so the peak is measured: the best rate of a
square float32 matmul on this host (what `benchmarks/` reports too).
"""

from __future__ import annotations

import functools
import time
from typing import Callable

import jax
import jax.numpy as jnp

# Lower-cased substrings of jax's `device_kind` -> dense bf16 FLOP/s per device.
PEAK_FLOPS_PER_DEVICE = (
    ("tpu v3", 61.5e12),          # 123 TFLOP/s per chip, two devices
    ("tpu v4", 275e12),
    ("tpu v5 lite", 197e12),      # v5e
    ("tpu v5e", 197e12),
    ("tpu v5p", 459e12),
    ("tpu v5", 459e12),           # v5p reports "TPU v5"
    ("a100", 312e12),
    ("h100", 989e12),
    ("h200", 989e12),
)


def matmul_flop_count(size: int) -> int:
    """FLOPs of one size x size by size x size matrix product."""
    return 2 * size ** 3


def matmul_timer(dtype: str = "float32", size: int = 1024) -> Callable[[], float]:
    """A function that runs one size x size matmul on the default device and returns the
    seconds it took (compiled here, once), for sampling the rate between the steps being
    measured.

    Each product is written over the previous one (a donated buffer), so sampling allocates
    nothing between the steps being measured."""
    a = jnp.ones((size, size), dtype)
    f = jax.jit(lambda x, previous: x @ x, donate_argnums=1)
    holder = [f(a, jnp.zeros_like(a))]
    holder[0].block_until_ready()

    def seconds() -> float:
        t = time.perf_counter()
        holder[0] = f(a, holder[0])
        holder[0].block_until_ready()
        return time.perf_counter() - t

    return seconds


def measure_matmul_flops(dtype: str = "float32", size: int = 1024, repeats: int = 5) -> float:
    """Best observed FLOP/s of a size x size matmul on the default device."""
    timer = matmul_timer(dtype, size)
    return matmul_flop_count(size) / min(timer() for _ in range(repeats))


def device_peak_flops(device_kind: str) -> float | None:
    """The table's peak for a jax `device_kind`, or None if it is not listed."""
    kind = device_kind.lower()
    for key, flops in PEAK_FLOPS_PER_DEVICE:
        if key in kind:
            return flops
    return None


@functools.lru_cache(maxsize=None)
def peak_flops() -> tuple[float, str]:
    """(peak FLOP/s of the whole run, where the number comes from). On CPU: the measured
    matmul rate of each host (simulated devices share its cores) times the processes."""
    device = jax.devices()[0]
    if device.platform == "cpu":
        rate = measure_matmul_flops()
        return rate * jax.process_count(), f"measured float32 matmul on CPU ({rate:.3g}/s)"
    per_device = device_peak_flops(device.device_kind)
    if per_device is None:
        return float("nan"), f"unknown peak for {device.device_kind!r}"
    return per_device * jax.device_count(), (f"{device.device_kind} bf16 peak "
                                             f"{per_device:.3g}/s x {jax.device_count()}")


def mfu(model_flops_per_step: float, step_time_s: float, peak: float) -> float:
    """Model FLOPs per second over the peak."""
    return model_flops_per_step / step_time_s / peak
