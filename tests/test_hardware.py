"""MFU's two halves: the model FLOPs of a training step (hand-counted for a tiny T5 below)
and the peak-FLOPs table per accelerator (a measured matmul rate on CPU)."""

import math
import warnings

import jax
import jax.numpy as jnp
import pytest

from t5x_like import flops, hardware
from t5x_like.families.t5.model import EncoderDecoderModel
from t5x_like.families.t5.network import T5Config


def test_train_step_flops_and_mfu_by_hand():
    """One encoder and one decoder layer, d_model 4, one head of 2, ReLU d_ff 8, vocab 10;
    3 input and 2 target tokens, batch 5.
      encoder: attention 2*4*2*(2*3 + 2*3) + 2*2*3*3*2 = 192 + 72; MLP 2*3*4*8*2 = 384 -> 648
      decoder: self 2*4*2*(4 + 4) + 2*2*2*2*2 = 160; cross 2*4*2*(4 + 6) + 2*2*2*3*2 = 208;
               MLP 2*2*4*8*2 = 256 -> 624
      logits:  2*2*4*10 = 160;  forward 1432;  train step 3 * 1432 * 5 = 21,480.
    At 0.5 s a step on a 1e5 FLOP/s machine: MFU 21,480 / 0.5 / 1e5 = 42.96%."""
    cfg = T5Config(
        vocab_size=10,
        emb_dim=4,
        num_heads=1,
        head_dim=2,
        mlp_dim=8,
        num_encoder_layers=1,
        num_decoder_layers=1,
    )
    step = flops.train_step_flops(EncoderDecoderModel(cfg).config, {"inputs": 3, "targets": 2}, 5)
    assert step == 21_480
    assert math.isclose(hardware.mfu(step, 0.5, 1e5), 0.4296)


@pytest.mark.parametrize(
    "kind,peak",
    [
        ("TPU v3", 61.5e12),
        ("TPU v4", 275e12),
        ("TPU v5 lite", 197e12),
        ("TPU v5p", 459e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H200", 989e12),
    ],
)
def test_peak_table(kind, peak):
    assert hardware.device_peak_flops(kind) == peak


def test_unknown_accelerator_has_no_peak():
    assert hardware.device_peak_flops("Imaginary NPU 9000") is None


def test_cpu_peak_is_measured():
    peak, source = hardware.peak_flops()
    assert jax.devices()[0].platform == "cpu"
    assert "measured" in source and 1e8 < peak < 1e14
    assert any(library in source for library in hardware.CPU_MATMUL_LIBRARIES)


@pytest.mark.parametrize("library", sorted(hardware.CPU_MATMUL_LIBRARIES))
def test_each_cpu_matmul_library_is_what_its_options_compile_to(library):
    """In XLA's optimized HLO: a YNNPACK fusion, or XLA's own dot (Eigen) and no fusion."""
    a = jnp.ones((64, 64))
    options = hardware.CPU_MATMUL_LIBRARIES[library]
    hlo = jax.jit(lambda x: x @ x).lower(a).compile(compiler_options=options).as_text()
    entry = hlo[hlo.index("ENTRY") :]
    assert ("__ynn_fusion" in entry) == (library == "YNNPACK")
    assert (" dot(" in entry) == (library == "Eigen")


def test_the_cpu_timer_keeps_the_fastest_library(monkeypatch):
    """Each library's product is timed in turn and the one with the best time is kept: here
    a fake 'Eigen' that is fastest in its best trial though not in its first."""
    seconds = {"YNNPACK": iter([1.5, 1.5, 1.5]), "Eigen": iter([3.0, 1.0, 3.0])}
    calls = []

    def fake_timer(a, options):
        library = next(n for n, o in hardware.CPU_MATMUL_LIBRARIES.items() if o == options)
        return lambda: calls.append(library) or next(seconds[library])

    monkeypatch.setattr(hardware, "_timer_for", fake_timer)
    timer = hardware.matmul_timer(size=8)
    assert timer.library == "Eigen"
    assert calls == ["YNNPACK", "Eigen"] * 3


def test_a_library_this_jaxlib_cannot_compile_is_skipped(monkeypatch):
    def fake_timer(a, options):
        if options is hardware.CPU_MATMUL_LIBRARIES["YNNPACK"]:
            raise jax.errors.JaxRuntimeError("INVALID_ARGUMENT: no YNNPACK here")
        return lambda: 1.0

    monkeypatch.setattr(hardware, "_timer_for", fake_timer)
    assert hardware.matmul_timer(size=8).library == "Eigen"


# jax's device_kind strings (what `jax.devices()[0].device_kind` says: libtpu's names for
# TPUs, CUDA's device name for NVIDIA GPUs) -> the data sheets' dense bf16 peak per device.
DATASHEET_PEAKS = [
    ("TPU v4", 275e12),  # Cloud TPU v4 docs: 275 TFLOP/s bf16 per chip
    ("TPU v5 lite", 197e12),  # Cloud TPU v5e docs: 197
    ("TPU v5", 459e12),  # Cloud TPU v5p docs: 459 (jax's name for v5p)
    ("TPU v5p", 459e12),
    ("TPU v6 lite", 918e12),  # Cloud TPU v6e (Trillium) docs: 918
    ("NVIDIA A100-SXM4-80GB", 312e12),  # A100 data sheet: 312 (624 sparse)
    ("NVIDIA A100-SXM4-40GB", 312e12),
    ("NVIDIA A100-PCIE-40GB", 312e12),
    ("NVIDIA H100 80GB HBM3", 989e12),  # H100 SXM: 1,979 sparse / 2
    ("NVIDIA H100 PCIe", 756e12),  # H100 PCIe: 1,513 sparse / 2
    ("NVIDIA H100 NVL", 835e12),  # H100 NVL: 1,671 sparse / 2
    ("NVIDIA H200", 989e12),  # H200 SXM: 1,979 sparse / 2
    ("NVIDIA H200 NVL", 835e12),  # H200 NVL: 1,671 sparse / 2
    ("NVIDIA B200", 2250e12),  # HGX B200: 4.5 PFLOP/s sparse / 2
    ("NVIDIA GB200", 2500e12),  # GB200 NVL72: 360 PFLOP/s sparse / 72 / 2
]


@pytest.mark.parametrize("kind,peak", DATASHEET_PEAKS)
def test_current_chips_have_their_datasheet_peak(kind, peak):
    assert hardware.device_peak_flops(kind) == peak


class _Device:
    platform, device_kind = "gpu", ""


@pytest.mark.parametrize("kind,peak", [("NVIDIA H200", 989e12), ("TPU v6 lite", 918e12)])
def test_run_peak_on_an_accelerator_is_per_device_times_devices(monkeypatch, kind, peak):
    device = _Device()
    device.device_kind = kind
    monkeypatch.setattr(jax, "devices", lambda: [device] * 8)
    monkeypatch.setattr(jax, "device_count", lambda: 8)
    hardware.peak_flops.cache_clear()
    try:
        total, source = hardware.peak_flops()
    finally:
        hardware.peak_flops.cache_clear()
    assert total == 8 * peak and kind in source and not math.isnan(hardware.mfu(1e15, 1.0, total))


def test_an_unknown_accelerator_is_said_once(monkeypatch):
    device = _Device()
    device.device_kind = "Imaginary NPU 9000"
    monkeypatch.setattr(jax, "devices", lambda: [device])
    monkeypatch.setattr(jax, "device_count", lambda: 1)
    hardware.peak_flops.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="no bf16 peak known for 'Imaginary NPU 9000'"):
            peak, source = hardware.peak_flops()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a second ask warns no more
            assert math.isnan(hardware.peak_flops()[0])
    finally:
        hardware.peak_flops.cache_clear()
    assert math.isnan(peak) and "PEAK_FLOPS_PER_DEVICE" in source
