"""Peak FLOP/s of the hardware a run is on, the denominator of model-FLOPs utilisation (MFU).

Accelerators: the vendor's dense bfloat16 peak per jax device (a TPU v3 exposes each of its two
TensorCores as a device; v4 and v5p chips are one "megacore" device each). CPUs have no
published figure that means anything for XLA, so the peak is measured: the best rate of a
square float32 matmul on this host (what `benchmarks/` reports too), under the fastest of the
matmul libraries XLA's CPU backend can call. The step itself runs its products through
YNNPACK (`host_runtime`); on the 2-core AMD EPYC of the benchmarks YNNPACK's 2048² product
ran at 130-190 GFLOP/s where Eigen's ran at 195-205 (numpy's BLAS 176-189), so a probe under
the step's own library alone overstated MFU by up to half.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp

# Lower-cased substrings of jax's `device_kind` -> dense (not sparse) bf16 FLOP/s per device,
# from the vendors' data sheets. The first match wins, so a specific name (a PCIe or NVL card)
# comes before its family's. jax's names: 'TPU v4', 'TPU v5 lite' (v5e), 'TPU v5' or
# 'TPU v5p' (v5p), 'TPU v6 lite' (v6e), 'NVIDIA A100-SXM4-80GB', 'NVIDIA H100 80GB HBM3',
# 'NVIDIA H200', 'NVIDIA B200' (CUDA's device name).
PEAK_FLOPS_PER_DEVICE = (
    # Cloud TPU docs, "TPU v3": 123 TFLOP/s bf16 per chip, two TensorCores (jax devices).
    ("tpu v3", 61.5e12),
    # Cloud TPU docs, "TPU v4": peak compute per chip (bf16) 275 TFLOP/s (one megacore device).
    ("tpu v4", 275e12),
    # Cloud TPU docs, "TPU v5e": peak compute per chip (bf16) 197 TFLOP/s.
    ("tpu v5 lite", 197e12),
    ("tpu v5e", 197e12),
    # Cloud TPU docs, "TPU v5p": peak compute per chip (bf16) 459 TFLOP/s; jax says "TPU v5".
    ("tpu v5p", 459e12),
    ("tpu v5", 459e12),
    # Cloud TPU docs, "TPU v6e" (Trillium): peak compute per chip (bf16) 918 TFLOP/s.
    ("tpu v6 lite", 918e12),
    ("tpu v6e", 918e12),
    # NVIDIA A100 Tensor Core GPU data sheet: BFLOAT16 Tensor Core 312 TFLOP/s (624 sparse),
    # SXM4 and PCIe, 40 and 80 GB alike.
    ("a100", 312e12),
    # NVIDIA H100 Tensor Core GPU data sheet: BFLOAT16 Tensor Core 1,979 / 1,513 / 1,671
    # TFLOP/s with sparsity for SXM / PCIe / NVL; dense is half.
    ("h100 pcie", 756e12),
    ("h100 nvl", 835e12),
    ("h100", 989e12),
    # NVIDIA H200 Tensor Core GPU data sheet: BFLOAT16 Tensor Core 1,979 (SXM) / 1,671 (NVL)
    # TFLOP/s with sparsity; dense is half.
    ("h200 nvl", 835e12),
    ("h200", 989e12),
    # NVIDIA GB200 NVL72 data sheet: FP16/BF16 Tensor Core 360 PFLOP/s with sparsity for 72
    # GPUs (5 each); dense is half. jax says "NVIDIA GB200".
    ("gb200", 2500e12),
    # NVIDIA HGX B200 data sheet: FP16/BF16 Tensor Core 4.5 PFLOP/s per GPU with sparsity
    # (36 PFLOP/s for eight); dense is half.
    ("b200", 2250e12),  # after "gb200"
)


def matmul_flop_count(size: int) -> int:
    """FLOPs of one size x size by size x size matrix product."""
    return 2 * size**3


# XLA CPU's matrix-multiply libraries, as compile options: YNNPACK (what `host_runtime`
# selects for the step) and XLA's own Eigen dot. Its experimental oneDNN path
# ({"xla_cpu_use_onednn": True, "xla_cpu_experimental_onednn_fusion_type":
# "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}) measured 0-5 % above Eigen on the probe's product but
# aborted the process now and then (training runs that had imported TensorFlow, which brings
# its own oneDNN; benchmarks/HISTORY.md part 7), so it is not probed: the peak may be that much
# low.
CPU_MATMUL_LIBRARIES: dict[str, dict[str, Any]] = {
    "YNNPACK": {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"},
    "Eigen": {"xla_cpu_experimental_ynn_fusion_type": ""},
}


def matmul_libraries() -> dict[str, dict[str, Any]]:
    """The matrix-multiply libraries to time on the default backend, as compile options:
    XLA CPU's (`CPU_MATMUL_LIBRARIES`, the step's own first), else XLA's one."""
    if jax.default_backend() == "cpu":
        return dict(CPU_MATMUL_LIBRARIES)
    return {"XLA": {}}


@dataclasses.dataclass(frozen=True)
class MatmulTimer:
    """Runs one size x size matmul and returns the seconds it took; `library` names the
    matmul library it was compiled for."""

    library: str
    run: Callable[[], float]

    def __call__(self) -> float:
        return self.run()


def donating_timer(
    fn: Callable[..., jax.Array],
    args: tuple[jax.Array, ...],
    compiler_options: dict[str, Any] | None = None,
) -> Callable[[], float]:
    """A timer of `fn(*args)`, compiled here once (with `compiler_options`) and run once to
    warm up: each call runs it and returns the seconds it took. Each result is written over
    the previous one (a donated buffer), as a step writes into buffers it already holds, so
    sampling allocates nothing and does not time the allocator's page faults."""

    def over_previous(*operands: jax.Array) -> jax.Array:
        return fn(*operands[:-1])

    out = jax.eval_shape(fn, *args)
    compiled = (
        jax.jit(over_previous, donate_argnums=len(args))
        .lower(*args, out)
        .compile(compiler_options=compiler_options)
    )
    holder = [compiled(*args, jnp.zeros(out.shape, out.dtype))]
    holder[0].block_until_ready()

    def seconds() -> float:
        t = time.perf_counter()
        holder[0] = compiled(*args, holder[0])
        holder[0].block_until_ready()
        return time.perf_counter() - t

    return seconds


def _timer_for(a: jax.Array, compiler_options: dict[str, Any]) -> Callable[[], float]:
    """The probe's timer for one library (the seam tests replace to fake libraries)."""
    return donating_timer(lambda x: x @ x, (a,), compiler_options)


def matmul_timer(dtype: str = "float32", size: int = 1024, trials: int = 3) -> MatmulTimer:
    """A timer of one size x size matmul on the default device (compiled here, once), for
    sampling the rate between the steps being measured. On CPU it is compiled for each of
    `CPU_MATMUL_LIBRARIES` this jaxlib accepts, each timed `trials` times in turn, and the
    fastest is kept: MFU is then against the best matmul rate XLA reaches on this host."""
    a = jnp.ones((size, size), dtype)
    libraries = matmul_libraries()
    timers = {}
    for library, options in libraries.items():
        try:
            timers[library] = _timer_for(a, options)
        except jax.errors.JaxRuntimeError:  # a jaxlib or CPU without this library
            continue
    if not timers:
        raise RuntimeError(
            f"XLA compiled a matmul with none of {sorted(libraries)}; check the jaxlib install."
        )
    best = dict.fromkeys(timers, float("inf"))
    for _ in range(trials):  # in turn, so a slow phase of a shared host hits them all
        for library, timer in timers.items():
            best[library] = min(best[library], timer())
    fastest = min(best, key=best.__getitem__)
    return MatmulTimer(fastest, timers[fastest])


def measure_matmul_flops(
    dtype: str = "float32",
    size: int = 1024,
    repeats: int = 5,
) -> tuple[float, str]:
    """(best observed FLOP/s of a size x size matmul on the default device, the library
    that reached it)."""
    timer = matmul_timer(dtype, size)
    return matmul_flop_count(size) / min(timer() for _ in range(repeats)), timer.library


def device_peak_flops(device_kind: str) -> float | None:
    """The table's peak for a jax `device_kind`, or None if it is not listed."""
    kind = device_kind.lower()
    for key, flops in PEAK_FLOPS_PER_DEVICE:
        if key in kind:
            return flops
    return None


@functools.cache
def peak_flops() -> tuple[float, str]:
    """(peak FLOP/s of the whole run, where the number comes from). On CPU: the measured
    matmul rate of each host (simulated devices share its cores) times the processes. An
    accelerator missing from the table gives NaN, said once in a warning and in the source."""
    device = jax.devices()[0]
    if device.platform == "cpu":
        rate, library = measure_matmul_flops()
        return rate * jax.process_count(), (
            f"measured float32 matmul on CPU ({rate:.3g}/s, {library})"
        )
    per_device = device_peak_flops(device.device_kind)
    if per_device is None:  # once: this function is cached
        source = (
            f"no bf16 peak known for {device.device_kind!r}, so MFU is not computed "
            f"(NaN); add its data sheet's dense figure to "
            f"t5x_like.hardware.PEAK_FLOPS_PER_DEVICE"
        )
        warnings.warn(source, RuntimeWarning, stacklevel=2)
        return float("nan"), source
    return per_device * jax.device_count(), (
        f"{device.device_kind} bf16 peak {per_device:.3g}/s x {jax.device_count()}"
    )


def mfu(model_flops_per_step: float, step_time_s: float, peak: float) -> float:
    """Model FLOPs per second over the peak."""
    return model_flops_per_step / step_time_s / peak
