"""MFU's two halves: the model FLOPs of a training step (hand-counted for a tiny T5 below)
and the peak-FLOPs table per accelerator (a measured matmul rate on CPU)."""

import math

import jax
import pytest

from t5x_like import flops, hardware
from t5x_like.models.encoder_decoder import EncoderDecoderModel
from t5x_like.models.t5 import T5Config


def test_train_step_flops_and_mfu_by_hand():
    """One encoder and one decoder layer, d_model 4, one head of 2, ReLU d_ff 8, vocab 10;
    3 input and 2 target tokens, batch 5.
      encoder: attention 2*4*2*(2*3 + 2*3) + 2*2*3*3*2 = 192 + 72; MLP 2*3*4*8*2 = 384 -> 648
      decoder: self 2*4*2*(4 + 4) + 2*2*2*2*2 = 160; cross 2*4*2*(4 + 6) + 2*2*2*3*2 = 208;
               MLP 2*2*4*8*2 = 256 -> 624
      logits:  2*2*4*10 = 160;  forward 1432;  train step 3 * 1432 * 5 = 21,480.
    At 0.5 s a step on a 1e5 FLOP/s machine: MFU 21,480 / 0.5 / 1e5 = 42.96%."""
    cfg = T5Config(vocab_size=10, emb_dim=4, num_heads=1, head_dim=2, mlp_dim=8,
                   num_encoder_layers=1, num_decoder_layers=1)
    step = flops.train_step_flops(EncoderDecoderModel(cfg).config, {"inputs": 3, "targets": 2}, 5)
    assert step == 21_480
    assert math.isclose(hardware.mfu(step, 0.5, 1e5), 0.4296)


@pytest.mark.parametrize("kind,peak", [
    ("TPU v3", 61.5e12), ("TPU v4", 275e12), ("TPU v5 lite", 197e12), ("TPU v5p", 459e12),
    ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H200", 989e12)])
def test_peak_table(kind, peak):
    assert hardware.device_peak_flops(kind) == peak


def test_unknown_accelerator_has_no_peak():
    assert hardware.device_peak_flops("Imaginary NPU 9000") is None


def test_cpu_peak_is_measured():
    peak, source = hardware.peak_flops()
    assert jax.devices()[0].platform == "cpu"
    assert "measured" in source and 1e8 < peak < 1e14
