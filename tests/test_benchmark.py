"""The throughput benchmark runs, reports consistent numbers and writes its JSON."""

import json

import pytest

from benchmarks import train_throughput


TINY = ["--gin", "T5Config.vocab_size=256", "--gin", "T5Config.emb_dim=32",
        "--gin", "T5Config.num_heads=2", "--gin", "T5Config.head_dim=16",
        "--gin", "T5Config.mlp_dim=64", "--gin", "T5Config.num_encoder_layers=1",
        "--gin", "T5Config.num_decoder_layers=1", "--gin", "T5Config.dropout_rate=0.0",
        "--batch", "8", "--inputs", "32", "--targets", "16", "--steps", "2"]


def test_benchmark_reports_and_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    result = train_throughput.main(TINY + ["--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["tokens_per_s"] == result["tokens_per_s"]
    assert abs(saved["tokens_per_s"] * saved["step_s_median"] - 8 * (32 + 16)) < 1e-6
    # A train step does at least 6 FLOPs per matmul weight per token (forward + backward):
    # the logits layer alone is 6 * 32 * 256 * (8 * 16) FLOPs.
    assert saved["flops_per_step"] >= 6 * 32 * 256 * 8 * 16
    assert 0 < saved["mfu"] < 1.5
    assert saved["compile_s"] > 0 and saved["peak_matmul_flops_per_s"] > 0


@pytest.mark.slow  # imports torch + transformers in a second process
def test_huggingface_reference_column(tmp_path, capsys):
    """--compare-hf times transformers' T5 of the same dimensions: same parameter count (the
    same model), its own step time and memory, and the speed ratio printed."""
    out = tmp_path / "bench.json"
    result = train_throughput.main(TINY + ["--compare-hf", "--out", str(out)])
    hf = json.loads(out.read_text())["hf"]
    assert hf["params"] == result["params"]
    assert hf["tokens_per_s"] > 0 and hf["host_max_rss_bytes"] > 0 and 0 < hf["mfu"] < 1.5
    assert "speed ratio (t5x_like / HF tokens/s)" in capsys.readouterr().out
