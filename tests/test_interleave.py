"""Interleaved timing (`benchmarks.interleave`): the A B B A order, the per-round ratios, and
the worker protocol over a real subprocess."""

import sys

import pytest

from benchmarks import interleave


def test_rounds_alternate_abba_then_baab_and_each_ratio_is_b_over_a():
    calls = []

    def fake(name, seconds):
        return lambda: calls.append(name) or seconds

    a_times, b_times, ratios = interleave.alternate(fake("a", 2.0), fake("b", 3.0), rounds=3)
    assert "".join(calls) == "abba" + "baab" + "abba"
    assert a_times == [2.0] * 6 and b_times == [3.0] * 6
    assert ratios == pytest.approx([1.5, 1.5, 1.5])


def test_a_round_ratio_uses_only_its_own_steps():
    a = iter([1.0, 1.0, 2.0, 2.0]).__next__  # the machine halves its speed in round 2
    b = iter([1.5, 1.5, 3.0, 3.0]).__next__
    _, _, ratios = interleave.alternate(a, b, rounds=2)
    assert ratios == pytest.approx([1.5, 1.5])
    assert interleave.quartiles(ratios)["ratio_median"] == pytest.approx(1.5)


WORKER = (
    "from benchmarks import interleave\n"
    "interleave.serve(interleave.timed(lambda: sum(range(1000))))\n"
    "print('done', flush=True)\n"
)


def test_a_step_server_answers_each_request_with_seconds_and_ends_on_close():
    server = interleave.StepServer([sys.executable, "-c", WORKER], name="test worker")
    seconds = [server.step() for _ in range(3)]
    assert all(0 < s < 5 for s in seconds)
    server.close()
    assert server.proc.returncode == 0
    assert server.proc.stdout.read().strip() == "done"


def test_a_worker_can_say_what_it_runs_when_ready():
    worker = (
        "from benchmarks import interleave\n"
        "interleave.serve(interleave.timed(lambda: None), about='Eigen')\n"
    )
    server = interleave.StepServer([sys.executable, "-c", worker], name="test worker")
    server.wait_ready()
    assert server.about == "Eigen"
    server.close()


def test_a_worker_that_dies_before_ready_is_reported():
    server = interleave.StepServer(
        [sys.executable, "-c", "raise SystemExit(3)"], name="broken worker"
    )
    with pytest.raises(SystemExit, match="broken worker process failed to start.*exit code 3"):
        server.wait_ready()
