"""MODEL_DIR, evaluation outputs and reports on a bucket go through the same code as local
files. TensorFlow's in-memory `ram://` filesystem stands in for `gs://` here: both are reached
only through tf.io.gfile, so code that slipped back to `open` / `os.makedirs` / `os.path.abspath`
fails these tests exactly as it would fail on Cloud Storage."""

import json
import os
import uuid

import jax
import jax.numpy as jnp
import pytest
import tensorflow as tf
from clu import metric_writers

from t5x_like import errors, evaluation, infer, report, storage, train


@pytest.fixture
def remote_dir():
    path = f"ram://t5x_like_test/{uuid.uuid4().hex}"
    yield path
    if tf.io.gfile.exists(path):
        tf.io.gfile.rmtree(path)


def test_remote_paths_are_kept_exactly_and_local_ones_made_absolute(tmp_path, monkeypatch):
    assert storage.resolve("gs://bucket/runs/t5") == "gs://bucket/runs/t5"
    assert storage.resolve("ram://x/y") == "ram://x/y"
    monkeypatch.chdir(tmp_path)
    assert storage.resolve("runs/t5") == str(tmp_path / "runs" / "t5")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert storage.resolve("~/r") == str(tmp_path / "r")


@pytest.mark.parametrize("where", ["local", "remote"])
def test_text_and_bytes_round_trip_creating_directories(where, tmp_path, remote_dir):
    root = str(tmp_path) if where == "local" else remote_dir
    path = os.path.join(root, "a", "b", "notes.txt")
    storage.write_text(path, "héllo\nworld\n")
    assert storage.exists(path) and storage.isdir(os.path.join(root, "a", "b"))
    assert storage.read_text(path) == "héllo\nworld\n"
    storage.write_text(path, "replaced")
    assert storage.read_text(path) == "replaced"
    assert tf.io.gfile.listdir(os.path.join(root, "a", "b")) == ["notes.txt"]  # no temp left
    storage.write_bytes(os.path.join(root, "img.bin"), b"\x00\x01")
    with tf.io.gfile.GFile(os.path.join(root, "img.bin"), "rb") as f:
        assert f.read() == b"\x00\x01"
    storage.remove(path)
    assert not storage.exists(path)


def test_model_dir_check_probes_a_remote_directory_without_rewriting_it(remote_dir):
    assert train._check_model_dir(remote_dir) == remote_dir
    assert tf.io.gfile.listdir(remote_dir) == []  # the probe file is gone again


def test_unwritable_model_dir_is_a_config_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(errors.ConfigError, match="not writable"):
        train._check_model_dir(str(blocker / "run"))


def test_predictions_and_infer_inputs_on_a_remote_path(remote_dir):
    out = os.path.join(remote_dir, "eval", "glue_cola_validation.jsonl")
    records = [
        {"inputs": "cola sentence: a", "prediction": "acceptable"},
        {"inputs": "é", "prediction": "unacceptable"},
    ]
    evaluation.write_jsonl(out, records)
    assert [json.loads(line) for line in storage.read_text(out).splitlines()] == records

    class Chars:  # a vocabulary of code points, enough to check what read_inputs does
        eos_id = 1

        def encode(self, text):
            return [ord(c) for c in text]

    prompts = os.path.join(remote_dir, "prompts.jsonl")
    storage.write_text(prompts, '{"inputs": "ab"}\n\n{"inputs": "c"}\n')
    examples = list(infer.read_inputs(prompts, Chars(), inputs_length=8))
    assert [e["inputs"].tolist() for e in examples] == [[97, 98, 1], [99, 1]]
    with pytest.raises(errors.ConfigError, match="does not exist"):
        list(infer.read_inputs(os.path.join(remote_dir, "missing.txt"), Chars(), 8))


def test_report_reads_and_writes_a_remote_run(remote_dir, capsys):
    """The event files come from clu's TensorBoard writer, as in training (whose
    create_default_writer wraps it and takes gs:// but not ram://); the table and the PNGs go
    through the remote filesystem."""
    writer = metric_writers.SummaryWriter(os.path.join(remote_dir, "tensorboard"))
    for step, loss in ((10, 5.0), (20, 4.0), (30, 3.5)):
        writer.write_scalars(
            step,
            {"train/loss": loss, "train/learning_rate": 0.01, "train/tokens_per_s": 1000.0 + step},
        )
    writer.flush()
    writer.close()
    assert report.main([remote_dir]) == 0
    table = capsys.readouterr().out
    assert f"Run {remote_dir}\n" in table and "last step            30\n" in table
    assert "final train loss     3.5000\n" in table
    for name in ("loss.png", "learning_rate.png", "throughput.png"):
        with tf.io.gfile.GFile(os.path.join(remote_dir, "report", name), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_profiler_trace_reaches_a_remote_model_dir(remote_dir):
    trace_dir = train._start_trace(remote_dir)
    assert not storage.is_remote(trace_dir)  # jax's profiler writes local files
    jax.block_until_ready(jax.jit(lambda x: x @ x)(jnp.ones((64, 64))))
    train._stop_trace(trace_dir, remote_dir)
    assert not os.path.exists(trace_dir)
    traces = [
        name
        for _, _, files in tf.io.gfile.walk(
            os.path.join(remote_dir, "tensorboard", "plugins", "profile")
        )
        for name in files
        if name.endswith(".xplane.pb")
    ]
    assert traces


def test_copy_tree_keeps_the_layout(tmp_path, remote_dir):
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "top.txt").write_text("1")
    (tmp_path / "d" / "e" / "deep.txt").write_text("2")
    storage.copy_tree(str(tmp_path / "d"), remote_dir)
    assert storage.read_text(os.path.join(remote_dir, "top.txt")) == "1"
    assert storage.read_text(os.path.join(remote_dir, "e", "deep.txt")) == "2"
    assert sorted(tf.io.gfile.listdir(remote_dir)) == ["e", "top.txt"]
