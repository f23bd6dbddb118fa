"""Preemption notices reach the training loop: SIGTERM and a Cloud VM's maintenance event, in
one process and across two (where every process must stop at the same step, and jax's
coordination service, not a Python handler, has to receive the SIGTERM)."""

import os
import signal
import subprocess
import sys
import time

from t5x_like import preemption
from tests.fake_metadata_server import FakeMetadataServer
from tests.test_multiprocess import ROOT, _env, _free_port

WORKER = os.path.join(ROOT, "tests", "preemption_worker.py")


def _wait_for(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def test_sigterm_stops_a_single_process_and_close_restores_the_handler():
    before = signal.getsignal(signal.SIGTERM)
    watcher = preemption.PreemptionWatcher(maintenance_event_url=None)
    assert not watcher.should_stop(1)
    os.kill(os.getpid(), signal.SIGTERM)
    assert _wait_for(lambda: watcher.should_stop(2))
    assert watcher.signal_name == "SIGTERM"
    watcher.close()
    assert signal.getsignal(signal.SIGTERM) is before


def test_maintenance_event_stops_a_single_process():
    with FakeMetadataServer() as server:
        watcher = preemption.PreemptionWatcher(maintenance_event_url=server.url, poll_seconds=0.02)
        try:
            assert _wait_for(lambda: server.requests >= 3)  # polled, and NONE means go on
            assert not watcher.should_stop(1)
            server.announce("TERMINATE_ON_HOST_MAINTENANCE")
            assert _wait_for(lambda: watcher.should_stop(2))
            assert watcher.signal_name == "maintenance event TERMINATE_ON_HOST_MAINTENANCE"
        finally:
            watcher.close()


def test_the_metadata_request_carries_the_required_header():
    with FakeMetadataServer() as server:
        assert preemption.read_maintenance_event(server.url) == "NONE"
        server.announce("MIGRATE_ON_HOST_MAINTENANCE")
        assert preemption.read_maintenance_event(server.url) == "MIGRATE_ON_HOST_MAINTENANCE"
    assert preemption.read_maintenance_event(server.url, timeout_s=0.5) is None  # server gone


def _two_processes(maintenance_url_for_process_1: str | None = None):
    port = _free_port()
    procs = []
    for i in range(2):
        args = [sys.executable, WORKER, str(i), str(port)]
        if i == 1 and maintenance_url_for_process_1:
            args.append(maintenance_url_for_process_1)
        procs.append(
            subprocess.Popen(
                args,
                cwd=ROOT,
                env=_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        )
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready"
    return procs


def _stop_lines(procs) -> list[str]:
    outs = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        outs.append(out.strip().splitlines()[-1])
    return outs


def test_sigterm_to_one_process_stops_both_at_the_same_step():
    procs = _two_processes()
    time.sleep(0.5)
    procs[0].send_signal(signal.SIGTERM)
    first, second = _stop_lines(procs)
    assert (
        first.startswith("stopped at step") and first.split(" by ")[0] == second.split(" by ")[0]
    ), (first, second)


def test_maintenance_event_seen_by_one_process_stops_both_at_the_same_step():
    with FakeMetadataServer() as server:
        procs = _two_processes(server.url)
        time.sleep(0.5)
        server.announce()
        first, second = _stop_lines(procs)
    assert (
        first.startswith("stopped at step") and first.split(" by ")[0] == second.split(" by ")[0]
    ), (first, second)
    assert second.endswith("by maintenance event TERMINATE_ON_HOST_MAINTENANCE")
