"""A CPU run's log is clean and uniform: none of the libraries' start-up notices that do not
concern the user (TensorFlow's oneDNN notice and CPU-instructions banner, its failed cuInit on
a host without a GPU, seqio's uncached-FunctionDataset and orbax's type-handler warnings),
every line our code logs starts with the time, and eval, convert, c4_clean and wordpiece show a
progress bar with rate and ETA as training does."""

import gzip
import json
import logging
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from tqdm import tqdm

from t5x_like import evaluation, host_runtime, logs
from tests.test_train import TINY_RUN

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What each unwanted line contains (the texts as TensorFlow, seqio and orbax print them).
NOISE = (
    "cuInit",
    "oneDNN",
    "TensorFlow binary is optimized",
    "uncached",
    "Could not find cuda drivers",
    "absl::InitializeLog",
    "Type handler registry",
)
# "2026-12-03 17:40:01  " - the documented format, written out by hand.
HAND_STAMP = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}  ")


# ----------------------------------------------------------------- the timestamp helper
def test_stamped_puts_the_local_time_before_every_line(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        # 1796319611 s after the epoch is 2026-12-03 17:40:11 UTC (`date -u -d @1796319611`).
        assert logs.stamped("step 1  loss 8.2\ntable row", when=1796319611) == (
            "2026-12-03 17:40:11  step 1  loss 8.2\n2026-12-03 17:40:11  table row"
        )
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_log_writes_a_stamped_line_to_stdout(capsys):
    logs.log("wrote 3 predictions")
    out = capsys.readouterr().out
    assert HAND_STAMP.match(out) and out.endswith("  wrote 3 predictions\n")
    assert logs.STAMP.match(out)


# ----------------------------------------------------------------- the quieting
def test_absl_notices_are_dropped_and_other_warnings_kept(caplog):
    from absl import logging as absl_logging

    host_runtime.quiet_library_logs()
    with caplog.at_level(logging.WARNING, logger="absl"):
        # seqio/dataset_providers.py's and orbax's texts, word for word.
        absl_logging.warning(
            "Using an uncached FunctionDataset for training is not recommended since it "
            "often results in insufficient shuffling on restarts, resulting in overfitting."
        )
        absl_logging.warning(
            'Type handler registry type "%s" overriding %s',
            "<class 'jax.jaxlib._jax.Array'>",
            "jax.Array",
        )
        absl_logging.warning("Checkpoint directory is on a slow disk")
    assert [r.getMessage() for r in caplog.records] == ["Checkpoint directory is on a slow disk"]


def test_native_stderr_filter_drops_only_the_matched_lines(capfd):
    with host_runtime.native_stderr_without(lambda line: "oneDNN" in line):
        os.write(
            2,
            b"I0000 00:00:1.0  7 port.cc:153] oneDNN custom operations are on.\n"
            b"E0000 00:00:1.0  7 file.cc:1] a real error\n",
        )
    assert capfd.readouterr().err == "E0000 00:00:1.0  7 file.cc:1] a real error\n"


def test_tensorflow_startup_lines_follow_tf_cpp_min_log_level(monkeypatch):
    """Below the level: dropped (I at 1; I and W at 2); errors kept until level 3."""
    info = "I0000 00:00:1796319611.239681   32318 port.cc:153] oneDNN custom operations\n"
    error = "E0000 00:00:1796319615.012979   32318 some.cc:52] disk full\n"
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    assert not host_runtime._tf_startup_noise(info)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    assert host_runtime._tf_startup_noise(info) and not host_runtime._tf_startup_noise(error)
    assert host_runtime._tf_startup_noise(
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    )


def test_cuinit_error_is_kept_on_a_host_with_an_nvidia_device(monkeypatch):
    line = (
        "E0000 00:00:1796319615.012979   32318 cuda_platform.cc:52] failed call to "
        "cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)\n"
    )
    monkeypatch.setattr(host_runtime, "has_nvidia_device", lambda: True)
    assert not host_runtime._no_gpu_host_noise(line)
    monkeypatch.setattr(host_runtime, "has_nvidia_device", lambda: False)
    assert host_runtime._no_gpu_host_noise(line)


def _raised(code: str, filename: str) -> BaseException:
    try:
        exec(compile(code, filename, "exec"), {})
    except BaseException as e:  # noqa: BLE001 - the exception is the test's material
        return e
    raise AssertionError("did not raise")


def test_orbax_writer_thread_failures_lose_their_traceback_not_their_line(caplog):
    """orbax's threads log a failed write with its traceback (and asyncio again as "never
    retrieved", when its future is collected, possibly after the trainer's own line); the main
    thread reports it in one line, so orbax's first line stays and asyncio's copy goes. Records
    whose traceback does not pass through orbax keep it."""
    from absl import logging as absl_logging

    host_runtime.quiet_library_logs()
    error = _raised(
        "raise ValueError('RESOURCE_EXHAUSTED: Failed writing: No space left')",
        os.path.join(os.sep, "site-packages", "orbax", "checkpoint", "future.py"),
    )
    ours = _raised("raise ValueError('a failure of our own')", __file__)
    with caplog.at_level(logging.ERROR):
        absl_logging.get_absl_logger().error(
            "_SignalingThread.run() raised an exception: %s\nmore",
            error,
            exc_info=(type(error), error, error.__traceback__),
        )
        logging.getLogger("asyncio").error(
            "Task exception was never retrieved\nfuture: ...",
            exc_info=(type(error), error, error.__traceback__),
        )
        absl_logging.get_absl_logger().error(
            "our own failure", exc_info=(type(ours), ours, ours.__traceback__)
        )
        logging.getLogger("asyncio").error(
            "Task exception was never retrieved", exc_info=(type(ours), ours, ours.__traceback__)
        )
    kept = [(r.name, r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert kept == [
        (
            "absl",
            "_SignalingThread.run() raised an exception: RESOURCE_EXHAUSTED: Failed "
            "writing: No space left",
            False,
        ),
        ("absl", "our own failure", True),
        ("asyncio", "Task exception was never retrieved", True),
    ]


def test_callbacks_into_a_closed_event_loop_are_not_reported(monkeypatch):
    """What tensorstore's late futures meet after orbax closed a failed save's loop: asyncio's
    own "Event loop is closed", raised by call_soon_threadsafe. Any other report goes on."""
    import asyncio
    import types

    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)
    host_runtime._drop_callbacks_into_closed_loops()
    loop = asyncio.new_event_loop()
    loop.close()
    try:
        loop.call_soon_threadsafe(lambda: None)
    except RuntimeError as e:
        closed = e
    other = RuntimeError("Event loop is closed")  # the same text, not from asyncio's check
    for error in (closed, other):
        sys.unraisablehook(
            types.SimpleNamespace(
                exc_type=RuntimeError,
                exc_value=error,
                exc_traceback=error.__traceback__,
                err_msg=None,
                object=None,
            )
        )
    assert [u.exc_value for u in reported] == [other]


# ----------------------------------------------------------------- progress bars
class _Vocab:
    def decode(self, ids):
        return " ".join(map(str, ids))


def test_eval_predict_shows_a_bar_with_count_and_rate(capsys):
    def predict_fn(params, batch):
        n = len(batch["inputs"])
        return np.full((n, 2), 5), np.zeros(n)

    examples = [{"inputs": np.array([3, 4, 1])} for _ in range(5)]
    out = evaluation.predict(
        predict_fn,
        None,
        examples,
        _Vocab(),
        batch_size=2,
        inputs_length=4,
        progress="eval toy",
        total=5,
    )
    assert len(out) == 5
    err = capsys.readouterr().err
    # tqdm's bar: "eval toy: 100%|####| 5/5 [00:00<00:00, 812.3ex/s]" (elapsed<ETA, rate).
    assert re.search(r"eval toy: 100%\|.*\| 5/5 \[\d\d:\d\d<\d\d:\d\d, .*ex/s\]", err), err


def test_c4_clean_shows_bytes_read_with_eta(tmp_path, capsys):
    from t5x_like.data import c4_clean

    page = [
        "This is a page about gardens and the plants in them.",
        "It has a second sentence that is also long enough here.",
        "And a third sentence closes the page for the cleaner.",
    ]
    with gzip.open(tmp_path / "crawl.jsonl.gz", "wt") as f:
        for i in range(3):
            f.write(json.dumps({"text": "\n".join(page), "url": f"u{i}"}) + "\n")
    c4_clean.main(
        ["--input", str(tmp_path / "crawl.jsonl.gz"), "--output", str(tmp_path / "out.json.gz")]
    )
    captured = capsys.readouterr()
    size = os.path.getsize(tmp_path / "crawl.jsonl.gz")
    assert re.search(
        rf"c4_clean read: 100%\|.*\| {size}/{size} \[\d\d:\d\d<\d\d:\d\d, ", captured.err
    ), captured.err
    assert all(HAND_STAMP.match(line) for line in captured.out.splitlines() if line)


def test_wordpiece_shows_bytes_counted_with_eta(tmp_path, capsys):
    from t5x_like.data import wordpiece

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat\nthe dog ran far away\n" * 50)
    wordpiece.main(
        ["--input", str(corpus), "--output", str(tmp_path / "vocab.txt"), "--vocab_size", "50"]
    )
    captured = capsys.readouterr()
    size = os.path.getsize(corpus)  # below 1 KiB, so tqdm writes the count unscaled
    assert size < 1024 * 10
    assert re.search(
        r"wordpiece count words: 100%\|.*\| [\d.]+k?/[\d.]+k? "
        r"\[\d\d:\d\d<\d\d:\d\d, ",
        captured.err,
    ), captured.err
    assert HAND_STAMP.match(captured.out) and "pieces to" in captured.out


def test_convert_shows_bytes_read_with_eta_and_says_what_it_writes(tmp_path, capsys):
    """A conversion's time goes to reading the checkpoint (45 GB for T5-11B): a bar of bytes
    read with rate and ETA; the one-call write is announced with its size and timed."""
    pytest.importorskip("transformers")
    from t5x_like import convert
    from tests.test_hf_parity import _make_hf_checkpoint

    model = _make_hf_checkpoint(tmp_path / "hf", "v1_1_gated_gelu_untied")
    assert convert.main(["--from_hf", str(tmp_path / "hf"), "--to", str(tmp_path / "ckpt")]) == 0
    captured = capsys.readouterr()
    # 4 bytes a float32 value, each of transformers' parameters once (safetensors stores
    # the tied embedding copies once; lm_head is its own tensor in this variant).
    params = sum(p.numel() for p in model.parameters())
    stored = 4 * params
    shown = tqdm.format_sizeof(stored, divisor=1024)  # as tqdm writes a count in B
    count = re.escape(f"{shown}/{shown}")
    assert re.search(
        rf"convert read: 100%\|.*\| {count} \[\d\d:\d\d<\d\d:\d\d, .*B/s\]", captured.err
    ), (shown, captured.err)
    out = captured.out.splitlines()
    assert all(HAND_STAMP.match(line) for line in out), out
    assert any(f"Writing {tmp_path / 'ckpt'}: {params:,} parameters" in line for line in out)
    assert re.search(rf"Wrote {tmp_path / 'ckpt'} in [\d.]+ s", captured.out), captured.out


# ----------------------------------------------------------------- a whole CPU run
@pytest.fixture(scope="module")
def tiny_run_log(tmp_path_factory):
    """stdout+stderr of a 2-step CPU training run, started as a user would (TF_CPP_MIN_LOG_LEVEL
    unset: the package's default must do)."""
    model_dir = tmp_path_factory.mktemp("clean_log") / "run"
    bindings = TINY_RUN + [
        f"MODEL_DIR={model_dir}",
        "TRAIN_STEPS=2",
        "train.log_every=1",
        "Evaluation.loss_every=0",
        "Evaluation.num_predictions=0",
    ]
    env = {
        k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "JAX_PLATFORMS")
    }
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run(
        [sys.executable, "-m", "t5x_like.train", "--gin_file=gin_configs/runs/quickstart.gin"]
        + [f"--gin.{b}" for b in bindings],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    return done.stdout


def test_cpu_run_prints_no_library_notices(tiny_run_log):
    found = [(word, line) for line in tiny_run_log.splitlines() for word in NOISE if word in line]
    assert not found, found


def _logged_lines(log: str) -> list[str]:
    """The lines train's `_log` wrote: the MFU line, every `step N  ...` line (metrics,
    checkpoint saved). tqdm redraws its bar with carriage returns, and into a pipe a logged
    line follows the bar's last drawing on the same line: split on both."""
    pieces = [p.strip(" ") for p in re.split(r"[\r\n]", log)]
    return [p for p in pieces if re.search(r"(^|  )(MFU is |step +\d+  )", p)]


def test_every_line_train_logs_starts_with_the_time(tiny_run_log):
    lines = _logged_lines(tiny_run_log)
    assert len(lines) >= 4, tiny_run_log[-3000:]  # MFU, steps 1 and 2, checkpoint saved
    assert all(HAND_STAMP.match(line) for line in lines), lines
