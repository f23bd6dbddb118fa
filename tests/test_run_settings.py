"""A run's settings and vocabulary are checked before anything is written into MODEL_DIR.

Bad values (a word for a number, a negative or zero batch) used to be tracebacks raised after
the run's `config.gin` was overwritten; a resume with a task of another vocabulary of the same
size trained on silently. Each case here is the command a user would type (`train.main`)."""

from __future__ import annotations

import os

import pytest
import seqio

from t5x_like import train
from tests.test_train import TINY_RUN


def _train(model_dir, *args, steps=2):
    return train.main(
        ["--gin_file=gin_configs/runs/quickstart.gin"]
        + [f"--gin.{b}" for b in TINY_RUN]
        + [
            f"--gin.MODEL_DIR={model_dir}",
            f"--gin.TRAIN_STEPS={steps}",
            "--gin.Evaluation.loss_every=0",
            "--gin.Evaluation.num_predictions=0",
            "--gin.Checkpointing.every=2",
            *args,
        ]
    )


def _tree(path):
    return sorted(
        os.path.relpath(os.path.join(d, f), path) for d, _, files in os.walk(path) for f in files
    )


@pytest.mark.parametrize(
    "binding,message",
    [
        ("TRAIN_STEPS=abc", "--gin.Schedule.train_steps must be an integer >= 1, not 'abc'"),
        ("Data.batch_size=-4", "--gin.Data.batch_size must be >= 1, not -4"),
        ("Data.batch_size=0", "--gin.Data.batch_size must be >= 1, not 0"),
        ("Checkpointing.keep=0", "--gin.Checkpointing.keep must be >= 1, not 0"),
        (
            "Schedule.warmup_proportion=1.5",
            "--gin.Schedule.warmup_proportion must be >= 0 <= 1, not 1.5",
        ),
        ("Schedule.peak_learning_rate=0", "--gin.Schedule.peak_learning_rate must be > 0, not 0"),
    ],
)
def test_a_bad_setting_is_one_line_and_writes_nothing(tmp_path, capsys, binding, message):
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    (model_dir / "config.gin").write_text("# the run's earlier operative config\n")
    before = _tree(model_dir)
    assert _train(model_dir, f"--gin.{binding}") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
    assert _tree(model_dir) == before
    assert (model_dir / "config.gin").read_text() == "# the run's earlier operative config\n"


@pytest.fixture(scope="module")
def other_vocabulary_task(tmp_path_factory):
    """The quickstart's task with another SentencePiece model of about the same size (trained
    here on the same corpus read backwards): the ids fit the model, the pieces differ."""
    import sentencepiece as spm

    from t5x_like import (
        offline_corpus,
        tasks,  # noqa: F401
    )

    directory = tmp_path_factory.mktemp("spm")
    reversed_text = directory / "reversed.txt"
    with open(offline_corpus.ensure_corpus()["train"], encoding="utf-8") as f:
        reversed_text.write_text("".join(line[::-1].strip() + "\n" for line in f))
    spm.SentencePieceTrainer.train(
        input=str(reversed_text),
        model_prefix=str(directory / "m"),
        vocab_size=1900,
        model_type="unigram",
        hard_vocab_limit=False,
    )
    vocabulary = seqio.SentencePieceVocabulary(str(directory / "m.model"), extra_ids=100)
    base = seqio.get_mixture_or_task("offline_span_corruption")
    features = {
        k: seqio.Feature(vocabulary, add_eos=f.add_eos, required=f.required)
        for k, f in base.output_features.items()
    }
    name = "offline_span_corruption_other_vocabulary"
    if name not in seqio.TaskRegistry.names():
        seqio.TaskRegistry.add_provider(name, base.replace(name=name, output_features=features))
    return name, str(directory / "m.model")


@pytest.mark.slow  # two training runs
def test_a_resume_with_another_vocabulary_is_refused_naming_both(
    tmp_path, capsys, other_vocabulary_task
):
    from t5x_like import offline_corpus

    name, other_file = other_vocabulary_task
    model_dir = tmp_path / "run"
    assert _train(model_dir) == 0
    capsys.readouterr()
    assert _train(model_dir, f"--gin.Data.task='{name}'", steps=4) == 2
    err = capsys.readouterr().err
    assert "was trained with the 'inputs' vocabulary SentencePiece" in err
    assert offline_corpus.vocabulary_path() in err and other_file in err
    assert sorted(os.listdir(model_dir / "checkpoints")) == ["2"]
    # The same vocabulary resumes.
    assert _train(model_dir, steps=4) == 0
