"""A tiny decoder-only language model trains on the offline corpus through the shared
trainer: causal LM (loss on every token) lowers its perplexity, and the prefix LM (inputs fully
visible, loss on the targets) runs on the same data."""

import os

import pytest

from t5x_like import gin_setup, logs, train

pytestmark = pytest.mark.slow  # training runs: .ci/run runs them after the default suite

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(tmp_path, task, lengths, steps, capsys):
    gin_setup.parse_gin(
        [
            os.path.join(ROOT, "gin_configs/models/gpt/tiny.gin"),
            os.path.join(ROOT, "gin_configs/runs/quickstart.gin"),
        ],
        [
            f"MODEL_DIR={tmp_path / task}",
            f"TRAIN_STEPS={steps}",
            f"TASK={task}",
            "train.model_class=@DecoderOnlyModel",
            f"Data.task_feature_lengths={lengths}",
            "Data.batch_size=8",
            "Optimizer.kind='adamw'",
            "Schedule.kind='linear_decay'",
            "Schedule.peak_learning_rate=3e-3",
            "Schedule.warmup_steps=5",
            "train.log_every=10",
            "Evaluation.loss_every=0",
            "Checkpointing.every=1000",
            "Evaluation.num_predictions=0",
        ],
    )
    train.train()
    out = capsys.readouterr().out
    return [
        float(line.split(" perplexity ")[1].split()[0])
        for line in logs.unstamped(out)
        if line.startswith("step") and " perplexity " in line
    ]


def test_causal_lm_perplexity_falls(tmp_path, capsys):
    perplexity = _run(tmp_path, "offline_lm", {"targets": 128}, 40, capsys)
    assert len(perplexity) == 4
    # A 2048-entry vocabulary starts near perplexity 2048; the frequent pieces come fast.
    assert perplexity[0] > 300 and perplexity[-1] < perplexity[0] / 3, perplexity


def test_prefix_lm_trains_on_inputs_and_targets(tmp_path, capsys):
    perplexity = _run(tmp_path, "offline_prefix_lm", {"inputs": 64, "targets": 64}, 10, capsys)
    assert len(perplexity) == 1 and perplexity[0] > 1.0


def test_gpt1_recipe_pretrains_then_fine_tunes_with_special_tokens(tmp_path):
    """The researcher's path on CPU: the offline pretraining recipe, then the GLUE fine-tuning
    recipe's command line from that checkpoint on the offline word-order task. The pretrained
    embedding table grows by the three special tokens, the classifier is new, and the run
    reports the auxiliary LM loss and the task's dev accuracy."""
    import subprocess
    import sys

    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}

    def run(*args):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "t5x_like.train",
                "--gin_file=gin_configs/models/gpt/tiny.gin",
                *args,
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    run(
        "--gin_file=gin_configs/runs/gpt_pretrain_offline.gin",
        f"--gin.MODEL_DIR={tmp_path / 'lm'}",
        "--gin.TRAIN_STEPS=20",
        "--gin.Evaluation.loss_every=0",
    )
    out = run(
        "--gin_file=gin_configs/runs/gpt_finetune.gin",
        f"--gin.MODEL_DIR={tmp_path / 'ft'}",
        f"--gin.INIT_CHECKPOINT={tmp_path / 'lm'}",
        "--gin.TASK=gpt_offline_word_order",
        "--gin.Schedule.train_epochs=None",
        "--gin.TRAIN_STEPS=20",
        "--gin.BATCH_SIZE=8",
        "--gin.Data.task_feature_lengths={'inputs': 32}",
        "--gin.Evaluation.metrics_examples=64",
        "--gin.train.log_every=10",
    )
    assert "token_embeddings/embedding extended from 2048 to 2051 rows" in out
    assert "newly initialised: classifier" in out
    lines = [line for line in logs.unstamped(out) if line.startswith("step")]
    assert any(" lm_loss " in line and " task_loss " in line for line in lines), lines
    assert any("gpt_offline_word_order: accuracy" in line for line in lines), lines
