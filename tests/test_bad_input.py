"""The bad-input catalogue: each mistake is caught before expensive work (no state is built,
no step compiled, nothing written to MODEL_DIR's checkpoints) with a message that says what to
do. One test per entry; all run the entry points of `python -m t5x_like.train` (or `.eval`,
`.infer`)."""

from __future__ import annotations

import os

import jax
import pytest

from t5x_like import train
from t5x_like.checkpoints import params_io
from t5x_like.families.gpt.model import DecoderOnlyModel
from t5x_like.families.gpt.network import GPTConfig
from tests.test_train import TINY_RUN
from tests.tiny_tfds import with_offline_vocabulary

GPT_TINY = [
    "--gin_file=gin_configs/runs/gpt_pretrain_offline.gin",
    "--gin_file=gin_configs/models/gpt/tiny.gin",
]


def _train(tmp_path, *args, files=("--gin_file=gin_configs/runs/quickstart.gin",), tiny=True):
    argv = list(files) + ([f"--gin.{b}" for b in TINY_RUN] if tiny else [])
    if not any(a.startswith("--gin.MODEL_DIR=") for a in args):
        argv.append(f"--gin.MODEL_DIR={tmp_path}/run")
    return train.main(
        argv
        + [
            "--gin.TRAIN_STEPS=2",
            "--gin.Evaluation.loss_every=0",
            "--gin.Evaluation.num_predictions=0",
            *args,
        ]
    )


def _refused(capsys, code=2) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: "), err[-2000:]
    return err


def test_unknown_task_suggests_close_names(tmp_path, capsys):
    assert _train(tmp_path, "--gin.TASK=offline_span_corruptoin") == 2
    assert (
        "Unknown task or mixture 'offline_span_corruptoin'. Did you mean "
        "'offline_span_corruption'" in _refused(capsys)
    )


def test_unknown_gin_binding_names_it(tmp_path, capsys):
    assert _train(tmp_path, "--gin.train.batch_sise=8") == 2
    err = _refused(capsys)
    assert "batch_sise" in err and "gin_configs/" in err


def test_mesh_that_does_not_divide_the_devices(tmp_path, capsys):
    assert _train(tmp_path, "--gin.make_mesh.num_partitions=3") == 2
    assert "num_partitions=3 does not divide the 8 devices; choose a divisor of 8" in _refused(
        capsys
    )


def test_task_vocabulary_larger_than_the_model(tmp_path, capsys):
    assert _train(tmp_path, "--gin.T5Config.vocab_size=1000") == 2
    assert (
        "uses a vocabulary of 2048 ids but the model has only 1000; set T5Config.vocab_size >= 2048"
    ) in _refused(capsys)


def _save_tiny(directory, config):
    model = DecoderOnlyModel(config) if isinstance(config, GPTConfig) else None
    params = jax.tree_util.tree_map(
        lambda x: x.value if hasattr(x, "value") else x,
        model.init(jax.random.key(0)),
        is_leaf=lambda x: hasattr(x, "value"),
    )
    params_io.save_params(str(directory), params, config, step=1)


def test_checkpoint_of_another_family(tmp_path, capsys):
    gpt = GPTConfig(
        vocab_size=2048,
        max_position_embeddings=16,
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        intermediate_size=32,
    )
    _save_tiny(tmp_path / "gpt", gpt)
    assert _train(tmp_path, f"--gin.Checkpointing.init_checkpoint='{tmp_path}/gpt'") == 2
    assert (
        "is a GPTConfig model, not a T5Config one; use a model gin file of its family"
        in _refused(capsys)
    )


def test_checkpoint_of_another_size_or_vocabulary(tmp_path, capsys):
    gpt = GPTConfig(
        vocab_size=2048,
        max_position_embeddings=64,
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        intermediate_size=32,
    )
    _save_tiny(tmp_path / "gpt", gpt)
    code = _train(
        tmp_path,
        f"--gin.Checkpointing.init_checkpoint='{tmp_path}/gpt'",
        "--gin.GPTConfig.vocab_size=4096",
        "--gin.GPTConfig.hidden_size=32",
        files=GPT_TINY,
        tiny=False,
    )
    assert code == 2
    err = _refused(capsys)
    assert "does not fit this model" in err and "vocab_size: checkpoint 2048 vs config 4096" in err
    assert "hidden_size: checkpoint 16 vs config 32" in err


def test_sequence_longer_than_the_position_table(tmp_path, capsys):
    code = _train(
        tmp_path,
        "--gin.GPTConfig.max_position_embeddings=64",
        "--gin.Data.task_feature_lengths={'targets': 128}",
        files=GPT_TINY,
        tiny=False,
    )
    assert code == 2
    assert (
        "Data.task_feature_lengths={'targets': 128} makes sequences of 128 tokens, but the "
        "model has 64 learned positions (GPTConfig.max_position_embeddings)"
    ) in _refused(capsys)


def test_missing_tfds_dataset_says_how_to_build_it(tmp_path, capsys):
    assert (
        train.main(
            [
                "--gin_file=gin_configs/runs/pretrain.gin",
                f"--gin.MODEL_DIR={tmp_path}/run",
                f"--gin.TFDS_DATA_DIR={tmp_path}/tfds",
            ]
        )
        == 2
    )
    err = _refused(capsys)
    assert "not prepared" in err and "tfds build c4" in err


def test_eval_and_infer_need_a_checkpoint_and_prepared_data(tmp_path, capsys, monkeypatch):
    """Checked before a model is built or a checkpoint read: no checkpoint named, then a task
    whose TFDS dataset is not prepared (was: a traceback from seqio, "has no splits")."""
    import seqio

    from t5x_like import eval as eval_lib
    from t5x_like import infer

    # A loader keeps the first data_dir override it reads (an earlier test's TFDS_DATA_DIR),
    # and its own wins over TFDS_DATA_DIR: point it at the empty directory for this test only.
    loader = seqio.get_mixture_or_task("glue_cola_v002").source.tfds_dataset
    monkeypatch.setattr(loader, "_data_dir_override", str(tmp_path / "tfds"))

    assert eval_lib.main(["--gin_file=gin_configs/runs/eval.gin"]) == 2
    assert "No checkpoint: pass --gin.CHECKPOINT=" in _refused(capsys)
    assert (
        infer.main(["--gin_file=gin_configs/runs/infer.gin", "--gin.INFER_TASK=glue_cola_v002"])
        == 2
    )
    assert "No checkpoint: pass --gin.CHECKPOINT=" in _refused(capsys)
    assert (
        eval_lib.main(
            [
                "--gin_file=gin_configs/runs/eval.gin",
                f"--gin.CHECKPOINT={tmp_path}/no_such_run",
                "--gin.EVAL_TASK=glue_cola_v002",
                f"--gin.TFDS_DATA_DIR={tmp_path}/tfds",
            ]
        )
        == 2
    )
    err = _refused(capsys)
    assert "'glue/cola" in err and "not prepared" in err and "tfds build glue/cola" in err
    assert "offline corpus" not in err  # a training task's alternative, not an evaluation's


def _corpus_run(tmp_path, text: bytes, *args):
    """Span corruption on a .txt corpus (text_corpus_*, with the offline vocabulary)."""
    (tmp_path / "corpus.txt").write_bytes(text)
    with_offline_vocabulary("text_corpus_span_corruption", "text_corpus_bad_input_test")
    return _train(
        tmp_path,
        "--gin.TASK=text_corpus_bad_input_test",
        f"--gin.text_corpus.train_files='{tmp_path}/corpus.txt'",
        f"--gin.text_corpus.validation_files='{tmp_path}/corpus.txt'",
        *args,
    )


def test_empty_dataset_after_filtering(tmp_path, capsys):
    assert _corpus_run(tmp_path, b"\n   \n\n") == 2  # every line blank: nothing survives
    err = _refused(capsys)
    assert "Task 'text_corpus_bad_input_test' gives no 'train' examples" in err
    assert "filtered every example out" in err
    assert not (tmp_path / "run" / "checkpoints").exists() or not os.listdir(
        tmp_path / "run" / "checkpoints"
    )


def test_non_utf8_line_in_a_text_source(tmp_path, capsys):
    assert _corpus_run(tmp_path, b"A first document.\n" + b"caf\xe9 au lait\n") == 2
    err = _refused(capsys)
    assert f"{tmp_path}/corpus.txt, line 2: not UTF-8 text (byte 0xe9 at column 4)" in err
    assert "iconv" in err


def test_batch_size_not_divisible_by_data_parallel_size_or_microbatches(tmp_path, capsys):
    assert _train(tmp_path, "--gin.Data.batch_size=12") == 2
    assert "batch size (Data.batch_size) 12 must be divisible by the data-parallel size (8" in (
        _refused(capsys)
    )
    assert _train(tmp_path, "--gin.Optimizer.num_microbatches=3") == 2
    assert "x num_microbatches (3) = 24" in _refused(capsys)


def test_model_dir_missing_or_not_writable(tmp_path, capsys):
    assert train.main(["--gin_file=gin_configs/runs/pretrain.gin"]) == 2
    assert "--gin.MODEL_DIR" in _refused(capsys)
    (tmp_path / "a_file").write_text("not a directory")
    assert _train(tmp_path, f"--gin.MODEL_DIR={tmp_path}/a_file/run") == 2
    err = _refused(capsys)
    assert f"MODEL_DIR {tmp_path}/a_file/run is not writable" in err
    assert "choose another --gin.MODEL_DIR" in err


def test_non_utf8_line_past_the_start_up_check_stops_the_pipeline_naming_the_file(tmp_path):
    """The start-up check reads the first MiB of each file; a bad line further on still stops
    the input pipeline with the file's name instead of feeding mojibake to the tokenizer."""
    import tensorflow as tf

    from t5x_like.data import text_files

    path = tmp_path / "big.txt"
    path.write_bytes(b"fine text\n\n" * 4 + b"caf\xe9\n")
    text_files.check_text_files([str(path)], max_bytes=32)  # the bad line is past 32 bytes
    source = text_files.TextFileDataSource({"train": str(path)})
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{path}.*is not UTF-8 text"):
        list(source.get_dataset("train", shuffle=False).as_numpy_iterator())
    path.write_bytes(b"fine text\n\n   \nmore text\n")  # blank lines: skipped, not documents
    docs = [
        d["text"]
        for d in text_files.TextFileDataSource({"train": str(path)})
        .get_dataset("train", shuffle=False)
        .as_numpy_iterator()
    ]
    assert docs == [b"fine text", b"more text"]
