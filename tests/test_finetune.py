"""Fine-tune, evaluate and infer end to end on a text-to-text task built from the offline
corpus ("first word: <sentence>" -> its first word): fine-tuning from a checkpoint with a
constant learning rate improves the task's metric over the untrained model; the best
checkpoint per task is kept; predictions are written as JSON lines."""

import json

import jax
import pytest

from t5x_like import eval as eval_lib
from t5x_like import infer, train
from t5x_like.checkpoints import params_io
from t5x_like.families.t5 import network as t5
from t5x_like.families.t5.model import EncoderDecoderModel
from t5x_like.models.base import unbox

TINY = [
    "--gin.T5Config.vocab_size=2048",
    "--gin.T5Config.emb_dim=64",
    "--gin.T5Config.num_heads=4",
    "--gin.T5Config.head_dim=16",
    "--gin.T5Config.mlp_dim=128",
    "--gin.T5Config.num_encoder_layers=2",
    "--gin.T5Config.num_decoder_layers=2",
    "--gin.T5Config.dropout_rate=0.0",
]
LENGTHS = "{'inputs': 32, 'targets': 8}"


def _evaluate(checkpoint, tmp_path, name):
    code = eval_lib.main(
        [
            "--gin_file=gin_configs/runs/eval.gin",
            *TINY,
            f"--gin.CHECKPOINT={checkpoint}",
            "--gin.EVAL_TASK=offline_first_word",
            f"--gin.evaluate.task_feature_lengths={LENGTHS}",
            "--gin.evaluate.max_examples=64",
            f"--gin.evaluate.output_dir={tmp_path / name}",
        ]
    )
    assert code == 0
    return json.loads((tmp_path / name / "metrics.json").read_text())["offline_first_word"]


@pytest.fixture(scope="module")
def untrained(tmp_path_factory):
    """A 'pretrained' checkpoint: the tiny model at its initialisation."""
    path = tmp_path_factory.mktemp("untrained")
    cfg = t5.T5Config(
        vocab_size=2048,
        emb_dim=64,
        num_heads=4,
        head_dim=16,
        mlp_dim=128,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dropout_rate=0.0,
    )
    params = unbox(EncoderDecoderModel(cfg).init(jax.random.key(0)))
    params_io.save_params(str(path), params, cfg)
    return path


@pytest.mark.slow  # ~2 minutes of training (the default suite must stay under 15 minutes)
def test_finetune_improves_the_metric_and_keeps_the_best(untrained, tmp_path):
    before = _evaluate(untrained, tmp_path, "before")["accuracy"]
    run = tmp_path / "run"
    code = train.main(
        [
            "--gin_file=gin_configs/runs/finetune.gin",
            *TINY,
            f"--gin.MODEL_DIR={run}",
            f"--gin.INIT_CHECKPOINT={untrained}",
            "--gin.TASK=offline_first_word",
            "--gin.TRAIN_STEPS=160",
            "--gin.BATCH_SIZE=32",
            f"--gin.Data.task_feature_lengths={LENGTHS}",
            "--gin.Schedule.constant_learning_rate=0.01",
            "--gin.Evaluation.metrics_every=80",
            "--gin.Evaluation.metrics_examples=64",
            "--gin.Evaluation.loss_every=0",
            "--gin.Checkpointing.every=80",
            "--gin.train.log_every=40",
        ]
    )
    assert code == 0
    after = _evaluate(run, tmp_path, "after")["accuracy"]
    assert before < 5.0 and after > before + 30.0, (before, after)
    best = json.loads((run / "best" / "best.json").read_text())["offline_first_word"]
    assert best["metric"] == "accuracy" and best["step"] in (80, 160)
    # The same 64 examples were scored in training at step 160: the best is at least that.
    assert best["value"] >= after - 1e-6
    # The kept best parameters load like any checkpoint.
    assert _evaluate(run / "best" / "offline_first_word", tmp_path, "best")[
        "accuracy"
    ] == pytest.approx(best["value"])
    lines = (tmp_path / "after" / "offline_first_word_validation.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    assert set(record) == {"inputs", "prediction", "score", "target"}
    assert record["inputs"].startswith("first word: ")


def test_infer_writes_jsonl_from_a_text_file(untrained, tmp_path):
    inputs = tmp_path / "inputs.txt"
    inputs.write_text("first word: Hello there.\nfirst word: Python is a language.\n")
    out = tmp_path / "out.jsonl"
    code = infer.main(
        [
            "--gin_file=gin_configs/runs/infer.gin",
            *TINY,
            f"--gin.CHECKPOINT={untrained}",
            "--gin.INFER_TASK=offline_first_word",
            f"--gin.infer.input_file={inputs}",
            f"--gin.infer.output_file={out}",
            f"--gin.infer.task_feature_lengths={LENGTHS}",
            "--gin.DecodeConfig.method=beam",
            "--gin.DecodeConfig.beam_size=2",
        ]
    )
    assert code == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["inputs"] for r in records] == [
        "first word: Hello there.",
        "first word: Python is a language.",
    ]
    assert all(isinstance(r["prediction"], str) and r["score"] <= 0 for r in records)


def test_checkpoint_of_another_model_is_refused(untrained, tmp_path, capsys):
    code = eval_lib.main(
        [
            "--gin_file=gin_configs/runs/eval.gin",
            *TINY,
            "--gin.T5Config.vocab_size=4096",
            f"--gin.CHECKPOINT={untrained}",
            "--gin.EVAL_TASK=offline_first_word",
        ]
    )
    assert code == 2
    assert "vocab_size: checkpoint 2048 vs config 4096" in capsys.readouterr().err
