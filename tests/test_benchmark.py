"""The throughput benchmark runs, reports consistent numbers and writes its JSON."""

import json

import numpy as np
import pytest

from benchmarks import train_throughput

TINY = [
    "--gin",
    "T5Config.vocab_size=256",
    "--gin",
    "T5Config.emb_dim=32",
    "--gin",
    "T5Config.num_heads=2",
    "--gin",
    "T5Config.head_dim=16",
    "--gin",
    "T5Config.mlp_dim=64",
    "--gin",
    "T5Config.num_encoder_layers=1",
    "--gin",
    "T5Config.num_decoder_layers=1",
    "--gin",
    "T5Config.dropout_rate=0.0",
    "--batch",
    "8",
    "--inputs",
    "32",
    "--targets",
    "16",
    "--steps",
    "2",
]


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
    # Each step against the rate sampled around it: every such rate is at most the run's
    # best (the `mfu` denominator), so the paired median cannot fall below `mfu`.
    paired = saved["mfu_paired"]
    assert paired["q1"] <= paired["median"] <= paired["q3"]
    assert paired["median"] >= saved["mfu"] - 1e-12
    assert 0 < paired["matmul_rate_median"] <= saved["peak_matmul_flops_per_s"]


def test_paired_mfu_takes_each_step_against_its_own_rate():
    """Hand-computed: 100 FLOPs in 1 s at 100 FLOP/s, in 2 s at 50, in 4 s at 50 -> MFUs 1, 1,
    0.5 (against the best rate alone they would be 1, 0.5, 0.25)."""
    paired = train_throughput.paired_mfu(100.0, [1.0, 2.0, 4.0], [100.0, 50.0, 50.0])
    assert paired == {"median": 1.0, "q1": 0.75, "q3": 1.0, "matmul_rate_median": 50.0}


@pytest.mark.slow  # imports torch + transformers in a second process
@pytest.mark.parametrize(
    "family,model",
    [
        ("t5", "T5ForConditionalGeneration"),
        ("bert", "BertForPreTraining"),
        ("decoder_only", "GPT2LMHeadModel"),
    ],
)
def test_huggingface_reference_column(tmp_path, capsys, family, model):
    """--compare-hf times transformers' model of the same family and dimensions, its steps
    alternating with ours: same parameter count (the same network), the same tokens per step,
    its own step times and memory, and the speed ratio per round printed."""
    args = {"t5": TINY, "bert": TINY_BERT, "decoder_only": TINY_GPT}[family]
    out = tmp_path / "bench.json"
    result = train_throughput.main(args + ["--steps", "2", "--compare-hf", "--out", str(out)])
    saved = json.loads(out.read_text())
    hf, rounds = saved["hf"], saved["interleaved"]
    assert hf["model"] == model
    assert hf["params"] == result["params"]
    assert hf["tokens_per_step"] == result["tokens_per_step"]
    assert hf["tokens_per_s"] > 0 and hf["host_max_rss_bytes"] > 0 and 0 < hf["mfu"] < 1.5
    assert hf["final_loss"] > 0
    assert rounds["rounds"] == 2 and len(rounds["other_steps_s"]) == 4  # A B B A, B A A B
    assert hf["step_s_median"] == np.median(rounds["other_steps_s"])
    assert len(rounds["ratios"]) == 2
    assert rounds["ratio_q1"] <= rounds["ratio_median"] <= rounds["ratio_q3"]
    assert "speed ratio (t5x_like / HF tokens/s)" in capsys.readouterr().out


TINY_GPT = [
    "--family",
    "decoder_only",
    "--gin",
    "GPTConfig.vocab_size=256",
    "--gin",
    "GPTConfig.hidden_size=32",
    "--gin",
    "GPTConfig.num_heads=2",
    "--gin",
    "GPTConfig.intermediate_size=64",
    "--gin",
    "GPTConfig.num_layers=2",
    "--gin",
    "GPTConfig.max_position_embeddings=64",
    "--gin",
    "GPTConfig.dropout_rate=0.0",
    "--gin",
    "GPTConfig.attention_dropout_rate=0.0",
    "--batch",
    "8",
    "--inputs",
    "16",
    "--targets",
    "16",
    "--steps",
    "1",
]
TINY_BERT = [
    "--family",
    "bert",
    "--gin",
    "BertConfig.vocab_size=256",
    "--gin",
    "BertConfig.hidden_size=32",
    "--gin",
    "BertConfig.num_heads=2",
    "--gin",
    "BertConfig.intermediate_size=64",
    "--gin",
    "BertConfig.num_layers=2",
    "--gin",
    "BertConfig.max_position_embeddings=64",
    "--gin",
    "BertConfig.dropout_rate=0.0",
    "--gin",
    "BertConfig.attention_dropout_rate=0.0",
    "--batch",
    "8",
    "--inputs",
    "32",
    "--targets",
    "5",
    "--steps",
    "1",
]


@pytest.mark.slow  # two sharded compiles; the T5 family runs in the default suite
@pytest.mark.parametrize(
    "args,tokens,vocab_flops",
    [
        # decoder-only: every one of the 8 x 32 positions is projected onto the vocabulary
        (TINY_GPT, 8 * 32, 6 * 32 * 256 * 8 * 32),
        # BERT: 32 tokens read per row, only the 5 masked positions reach the vocabulary
        (TINY_BERT, 8 * 32, 6 * 32 * 256 * 8 * 5),
    ],
)
def test_every_family_benchmarks(tmp_path, args, tokens, vocab_flops):
    result = train_throughput.main(args + ["--out", str(tmp_path / "bench.json")])
    assert abs(result["tokens_per_s"] * result["step_s_median"] - tokens) < 1e-6
    assert result["flops_per_step"] >= vocab_flops
    assert 0 < result["mfu"] < 1.5 and np.isfinite(result["final_loss"])


TINY_T5 = TINY[:14]  # the model bindings only


def test_a_model_without_a_huggingface_twin_is_refused_before_compiling(capsys, monkeypatch):
    """A T5-style language model (relative position bias) has no transformers GPT class."""
    monkeypatch.setattr(train_throughput, "run", None)  # reaching the step would fail here
    with pytest.raises(SystemExit):
        train_throughput.main(
            TINY_GPT
            + [
                "--gin",
                "GPTConfig.position_encoding='relative'",
                "--steps",
                "2",
                "--compare-hf",
                "--out",
                "/dev/null",
            ]
        )
    assert "--compare-hf: transformers' GPT models have no equivalent" in capsys.readouterr().err


def test_decode_benchmark_matches_huggingface_generate(tmp_path):
    """Same weights in transformers: greedy decoding picks the same tokens, beam search runs;
    every sequence is decoded to full length on both sides."""
    pytest.importorskip("transformers")
    from benchmarks import decode_throughput

    out = tmp_path / "decode.json"
    rows = decode_throughput.main(
        TINY_T5
        + [
            "--batch_sizes",
            "1,3",
            "--new_tokens",
            "6",
            "--inputs",
            "10",
            "--repeats",
            "1",
            "--compare-hf",
            "--out",
            str(out),
        ]
    )
    assert [(r["method"], r["batch"]) for r in rows] == [
        ("greedy", 1),
        ("beam", 1),
        ("greedy", 3),
        ("beam", 3),
    ]
    for r in rows:
        assert abs(r["tokens_per_s"] * r["seconds"] - r["batch"] * 6) < 1e-6
        assert r["hf_tokens_per_s"] > 0
    assert all(r["same_tokens"] == 1.0 for r in rows if r["method"] == "greedy")
    assert json.loads(out.read_text())["rows"][0]["method"] == "greedy"


def test_input_benchmark_counts_real_tokens(tmp_path):
    """A packed LM batch is nearly full: real tokens per second / examples per second is the
    average number of non-padding positions per row, at most the row length."""
    from benchmarks import input_throughput

    rows = input_throughput.main(
        [
            "--pipelines",
            "packed_lm",
            "--batches",
            "3",
            "--step_steps",
            "0",
            "--out",
            str(tmp_path / "in.json"),
        ]
    )
    (row,) = rows
    per_row = row["tokens_per_s"] / row["examples_per_s"]
    assert 0.5 * 512 < per_row <= 512


@pytest.mark.slow  # three pipelines (~35 s); test_exact_resume covers the restore by default
def test_resume_benchmark_restores_the_batch_skipping_reads(tmp_path):
    """(The benchmark itself checks the restored first batch equals the skipped one's.)"""
    from benchmarks import resume_input

    (row,) = resume_input.main(
        [
            "--pipelines",
            "packed_lm",
            "--batch",
            "4",
            "--at",
            "3",
            "--out",
            str(tmp_path / "resume.json"),
        ]
    )
    assert row["resume_at_batch"] == 3 and row["state_bytes"] > 0


@pytest.mark.slow  # three pipelines and three benchmark-width train steps
def test_input_benchmark_compares_with_the_step(tmp_path):
    from benchmarks import input_throughput

    rows = input_throughput.main(
        ["--batches", "3", "--step_steps", "1", "--out", str(tmp_path / "in.json")]
    )
    assert [r["pipeline"] for r in rows] == ["span_corruption", "bert_masking", "packed_lm"]
    for r in rows:
        assert r["headroom"] == pytest.approx(r["examples_per_s"] * r["step_s"] / r["batch"])


@pytest.mark.slow  # two sharded compiles
def test_sequence_length_sweep_keeps_tokens_and_grows_attention_share():
    import dataclasses

    from benchmarks import sequence_length

    cfg = dataclasses.replace(
        train_throughput.BENCHMARK_CONFIG,
        vocab_size=256,
        emb_dim=32,
        num_heads=2,
        head_dim=16,
        mlp_dim=64,
        num_encoder_layers=1,
        num_decoder_layers=1,
    )
    rows = sequence_length.run([16, 64], 512, 1, cfg, None)
    assert [(r["batch"], r["targets"]) for r in rows] == [(32, 4), (8, 16)]
    # Scores: 4 * heads*head_dim * (L^2 + (L/4)^2 + L * L/4) per example, x3 for training.
    inner = 2 * 16
    want = 3 * 4 * inner * (64 * 64 + 16 * 16 + 16 * 64) * 8
    assert rows[1]["attention_score_share"] * train_throughput.flops.train_step_flops(
        cfg, {"inputs": 64, "targets": 16}, 8
    ) == pytest.approx(want)
    assert rows[1]["attention_score_share"] > rows[0]["attention_score_share"]
