"""Exact resume: a run killed with kill -9 at a random step and rerun ends bit-identical to an
uninterrupted run, and the global sequence of batches does not depend on the host count."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from t5x_like import logs, train_data
from t5x_like.checkpoints import input_state
from t5x_like.errors import ConfigError
from t5x_like.families.t5.model import EncoderDecoderModel
from tests.test_train import ROOT, TINY_RUN

LENGTHS = {"inputs": 64, "targets": 16}
T5 = EncoderDecoderModel()  # its feature converter and features; nothing is initialised


def _take(order, n, **kwargs):
    return list(
        train_data.host_dataset(order, LENGTHS, model=T5, **kwargs).take(n).as_numpy_iterator()
    )


@pytest.mark.slow  # seven pipelines, ~40 s (the default suite must stay under 15 minutes)
def test_global_batches_are_the_same_on_1_2_and_4_hosts_and_from_any_step():
    order = train_data.DataOrder("offline_span_corruption", batch_size=8, seed=3, data_shards=4)
    one_host = _take(order, 4, process_index=0, process_count=1)
    for hosts in (2, 4):
        parts = [_take(order, 4, process_index=p, process_count=hosts) for p in range(hosts)]
        for step, batch in enumerate(one_host):
            for key, value in batch.items():
                np.testing.assert_array_equal(
                    value,
                    np.concatenate([part[step][key] for part in parts]),
                    err_msg=f"{hosts} hosts, batch {step}, {key}",
                )
    resumed = _take(order, 2, start_batch=2, process_index=0, process_count=1)
    for expected, got in zip(one_host[2:], resumed):
        for key in expected:
            np.testing.assert_array_equal(expected[key], got[key])
    # Every row is real data, and the shards differ (rows are not copies of one stream).
    tokens = one_host[0]["encoder_input_tokens"]
    assert (tokens[:, 0] > 0).all() and len({row.tobytes() for row in tokens}) == 8


def _concat(batches):
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def test_a_saved_input_position_restores_the_stream_on_any_host_count():
    """The stream one host saved after 3 batches continues, restored on two hosts (each from
    the saved state of its own data shard), with exactly the batches the uninterrupted stream
    reads next, without re-reading (the streams say they were restored). A position that does
    not match the resume step falls back to skipping, and still continues exactly. Saved in
    TensorFlow's `ram://` filesystem, which stands in for a bucket (`gs://`) here."""
    saved = f"ram://t5x_like_test/{uuid.uuid4().hex}/input_state/3"
    order = train_data.DataOrder("offline_span_corruption", batch_size=4, seed=5, data_shards=2)
    one = dict(process_index=0, process_count=1)
    stream = train_data.HostBatches(order, LENGTHS, model=T5, **one)
    for _ in range(3):
        next(stream)
    assert stream.save(saved) is None
    expected = [next(stream) for _ in range(2)]
    assert stream.position == 5

    hosts = [
        train_data.HostBatches(
            order,
            LENGTHS,
            model=T5,
            start_batch=3,
            restore_from=saved,
            process_index=p,
            process_count=2,
        )
        for p in range(2)
    ]
    assert all(h.how_started.startswith("restored") for h in hosts), hosts[0].how_started
    for expected_batch in expected:
        got = _concat([next(h) for h in hosts])
        for key, value in expected_batch.items():
            np.testing.assert_array_equal(value, got[key], err_msg=key)

    # Saved at batch 3, asked for batch 4: the saved position is not used.
    skipped = train_data.HostBatches(
        order,
        LENGTHS,
        model=T5,
        start_batch=4,
        restore_from=saved,
        process_index=1,
        process_count=2,
    )
    assert skipped.how_started.startswith("skipped 4 batches"), skipped.how_started
    for key, value in next(skipped).items():
        np.testing.assert_array_equal(value, expected[1][key][2:], err_msg=key)


def test_a_pipeline_that_cannot_be_saved_says_why_and_resumes_by_skipping(tmp_path, monkeypatch):
    """A Python generator source: TensorFlow cannot checkpoint its iterator. The save reports
    it instead of failing the run, and the resume skips to the same batch."""
    import tensorflow as tf

    def generated(*args):
        return {
            0: tf.data.Dataset.from_generator(
                lambda: ({"x": [i]} for i in range(100)),
                output_signature={"x": tf.TensorSpec([1], tf.int64)},
            )
        }

    monkeypatch.setattr(train_data, "_shard_datasets", generated)
    order = train_data.DataOrder("generated", batch_size=1, seed=0, data_shards=1)
    stream = train_data.HostBatches(order, {}, model=T5, process_index=0, process_count=1)
    next(stream), next(stream)
    why_not = stream.save(str(tmp_path / "2"))
    assert why_not.startswith("FailedPreconditionError") and "stateful" in why_not, why_not
    resumed = train_data.HostBatches(
        order,
        {},
        model=T5,
        start_batch=2,
        restore_from=str(tmp_path / "2"),
        process_index=0,
        process_count=1,
    )
    assert resumed.how_started.startswith("skipped 2 batches (no saved position"), (
        resumed.how_started
    )
    assert next(resumed)["x"].tolist() == [2] == next(stream)["x"].tolist()


def test_saved_input_positions_are_pruned_with_the_checkpoints(tmp_path):
    for step in (2, 4, 6):
        os.makedirs(input_state.input_state_dir(str(tmp_path), step))
    os.makedirs(tmp_path / input_state.INPUT_STATE_DIR / "notes")
    input_state.remove_input_states_before(str(tmp_path), 4)
    assert sorted(os.listdir(tmp_path / input_state.INPUT_STATE_DIR)) == ["4", "6", "notes"]


def test_data_shards_are_checked_before_any_work():
    saved = train_data.DataOrder("t", 8, 0, 4)
    assert train_data.resolve_data_shards(None, 8, 1) == 1
    assert train_data.resolve_data_shards(None, 8, 2, saved) == 4
    with pytest.raises(ConfigError, match="must be >= 1 and divide Data.batch_size=8"):
        train_data.resolve_data_shards(3, 8, 1)
    with pytest.raises(ConfigError, match="4 shards, which 3 processes cannot split evenly"):
        train_data.resolve_data_shards(None, 12, 3, saved)
    with pytest.raises(ConfigError, match="reads its data in 4 shards"):
        train_data.resolve_data_shards(2, 8, 1, saved)


def _command(model_dir, steps):
    bindings = TINY_RUN + [
        f"MODEL_DIR={model_dir}",
        f"TRAIN_STEPS={steps}",
        "Evaluation.loss_every=0",
        "Evaluation.num_predictions=0",
        "Checkpointing.every=4",
        "train.log_every=1",
        "T5Config.dropout_rate=0.1",
    ]  # dropout: the rng must resume too
    return [
        sys.executable,
        "-m",
        "t5x_like.train",
        "--gin_file=gin_configs/runs/quickstart.gin",
    ] + [f"--gin.{b}" for b in bindings]


def _environment(devices):
    flags = os.environ.get("XLA_FLAGS", "").split()
    flags = [f for f in flags if "xla_force_host_platform_device_count" not in f]
    return {
        **os.environ,
        "XLA_FLAGS": " ".join(flags + [f"--xla_force_host_platform_device_count={devices}"]),
    }


def _losses(stdout):
    return {
        int(line.split()[1]): line.split("loss ")[1].split()[0]
        for line in logs.unstamped(stdout)
        if line.startswith("step") and "  loss " in line
    }


def _saved(model_dir, step, item):
    path = os.path.join(model_dir, "checkpoints", str(step), item)
    return jax.tree_util.tree_map(np.asarray, ocp.PyTreeCheckpointer().restore(path))


def _steps(model_dir):
    directory = os.path.join(model_dir, "checkpoints")
    return (
        sorted(int(d) for d in os.listdir(directory) if d.isdigit())
        if os.path.isdir(directory)
        else []
    )


@pytest.mark.slow  # three training subprocesses each (~100-150 s); CI runs the slow set
@pytest.mark.parametrize("devices", [8, 1])
def test_kill_9_at_a_random_step_then_rerun_is_bit_identical(devices, tmp_path):
    steps, env = 40, _environment(devices)
    reference = subprocess.run(
        _command(tmp_path / "reference", steps),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert reference.returncode == 0, reference.stderr[-3000:]

    rng = random.Random()
    kill_after = rng.randrange(4, 24)  # a checkpoint at or after this step, then a random wait
    killed_dir = tmp_path / "killed"
    proc = subprocess.Popen(
        _command(killed_dir, steps),
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 300
        while not any(s >= kill_after for s in _steps(killed_dir)):
            assert time.time() < deadline and proc.poll() is None, "no checkpoint to kill after"
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.3))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    resumed_from = max(_steps(killed_dir))
    assert resumed_from < steps, "the run ended before it was killed: nothing was tested"

    resumed = subprocess.run(
        _command(killed_dir, steps), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Resumed from the checkpoint at step {resumed_from}" in resumed.stdout
    assert "input pipeline: restored from" in resumed.stdout  # no batch re-read
    expected, got = _losses(reference.stdout), _losses(resumed.stdout)
    assert sorted(got) == list(range(resumed_from + 1, steps + 1))
    assert {s: expected[s] for s in got} == got
    for item in ("params", "opt_state"):
        want, have = _saved(tmp_path / "reference", steps, item), _saved(killed_dir, steps, item)
        for (path, a), b in zip(
            jax.tree_util.tree_leaves_with_path(want), jax.tree_util.tree_leaves(have)
        ):
            np.testing.assert_array_equal(
                a,
                b,
                err_msg=f"{item} {jax.tree_util.keystr(path)} (killed after step {resumed_from})",
            )


@pytest.mark.slow  # four training processes (~3 min)
def test_a_run_resumed_on_two_hosts_sees_the_same_batches_as_on_one(tmp_path):
    """One process (4 devices) trains 4 of 8 steps in data_shards=2; the rerun as two processes
    (2 devices each, jax.distributed over gloo) continues with the batches the one-process run
    would have used: its losses equal an uninterrupted one-process run's. (Equal to the printed
    4 decimals, not bitwise: the gradient sum now crosses processes.)"""
    from tests.test_multiprocess import _env, _free_port

    def command(model_dir, steps):
        return _command(model_dir, steps)[:-1] + [  # (no dropout: same masks either way)
            "--gin.T5Config.dropout_rate=0.0",
            "--gin.Data.shards=2",
        ]

    env = {**_env(), "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    reference = subprocess.run(
        command(tmp_path / "reference", 8),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert reference.returncode == 0, reference.stderr[-3000:]
    first = subprocess.run(
        command(tmp_path / "run", 4), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert first.returncode == 0, first.stderr[-3000:]
    port = _free_port()
    procs = [
        subprocess.Popen(
            command(tmp_path / "run", 8),
            cwd=ROOT,
            env={
                **_env(),
                "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
                "T5X_LIKE_COORDINATOR": f"127.0.0.1:{port}",
                "T5X_LIKE_NUM_PROCESSES": "2",
                "T5X_LIKE_PROCESS_ID": str(i),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-2000:] for o in outputs)
    expected = _losses(reference.stdout)
    for i, out in enumerate(outputs):
        assert f"[process {i}/2] Resumed from the checkpoint at step 4" in out
        assert "input pipeline: restored from" in out  # the shard the one process saved
        lines = [line.split("] ", 1)[1] for line in logs.unstamped(out) if line.startswith("[")]
        got = _losses("\n".join(lines))
        assert sorted(got) == [5, 6, 7, 8]
        assert {s: expected[s] for s in got} == got, (i, got, expected)
