"""Stop cleanly when the machine is about to go away: SIGTERM (what a spot/preemptible VM, a
SLURM time limit, `kill` or Kubernetes send first) or a host maintenance event announced by the
Cloud VM's metadata server (what a TPU VM gets before maintenance takes it down).

One process: a SIGTERM handler or the maintenance poller sets a flag and the training loop, at
the next step boundary, saves a checkpoint at that step and returns normally (exit code 0), so
rerunning the same command resumes there. Before the first step (start-up: data, compilation)
a SIGTERM ends the process at once, with exit code 0 and nothing saved, as nothing was trained:
the handler runs the run's clean-up (its message, the MODEL_DIR lock) and calls `os._exit(0)`.
It does not raise: an exception raised from a signal handler surfaces inside whatever the main
thread was running (a gc callback swallows it and start-up carries on; unwound through XLA
compilation or a tf.data pipeline it left the process to segfault at exit). Start-up writes
nothing a sudden end could leave half-written (`storage.write_text` renames into place). The
handler stays installed until the last save has finished, so a second SIGTERM during it is
not fatal: it is logged and the save goes on.

Several processes: jax's preemption sync point (`multihost_utils.reached_preemption_sync_point`,
fed by the coordination service) makes every process stop at the same step, as orbax's
checkpointing of a sharded state requires. The service learns of a preemption through its own
SIGTERM handler, so here no Python handler may replace it (one would swallow the signal and no
process would ever stop); a maintenance notice seen by any process is passed on by sending
that process SIGTERM.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import urllib.request
from collections.abc import Callable
from types import FrameType
from typing import Any

import gin
import jax

from t5x_like import logs

# The Compute Engine metadata server's maintenance notice: NONE until the host is about to be
# serviced, then MIGRATE_ON_HOST_MAINTENANCE or TERMINATE_ON_HOST_MAINTENANCE.
GCE_MAINTENANCE_EVENT_URL = (
    "http://metadata.google.internal/computeMetadata/v1/instance/maintenance-event"
)
_NO_EVENT = "NONE"


def on_google_cloud() -> bool:
    """A Compute Engine VM (Cloud TPU VMs are ones), told by its DMI product name: no network."""
    try:
        with open("/sys/class/dmi/id/product_name", encoding="utf-8") as f:
            return "Google" in f.read()
    except OSError:
        return False


def read_maintenance_event(url: str, timeout_s: float = 2.0) -> str | None:
    """The metadata server's current notice, or None when it cannot be asked."""
    request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.read().decode().strip()
    except Exception:  # noqa: BLE001 - no metadata server: nothing to watch
        return None


def _say(message: str) -> None:
    """A log line from a signal handler: one os.write to stdout's descriptor, since the
    handler may have interrupted a write to sys.stdout (a print there could raise a reentrant
    call error)."""
    try:
        os.write(sys.stdout.fileno(), (logs.stamped(message) + "\n").encode())
    except (OSError, ValueError, AttributeError):  # no stdout to write to
        pass


@gin.configurable
class PreemptionWatcher:
    """`should_stop(step)` after each step; `close()` restores the previous SIGTERM handler and
    stops the poller.

    `maintenance_event_url`: the metadata endpoint to poll every `poll_seconds` ('auto': the
    Compute Engine one when running on a Google Cloud VM, else nothing is polled; None: never).
    `end_start_up`: given, a signal before `started()` calls it with the signal's name, then
    ends the process with exit code 0.
    """

    def __init__(
        self,
        maintenance_event_url: str | None = "auto",
        poll_seconds: float = 5.0,
        end_start_up: Callable[[str], None] | None = None,
    ) -> None:
        self.signal_name: str | None = None
        self._end_start_up = end_start_up  # None once started(): signals stop at a step
        self._previous: Any = None  # the SIGTERM handler before ours
        self._multi_process = jax.process_count() > 1
        self._closed = threading.Event()
        if not self._multi_process:
            self._install_handler()
        if maintenance_event_url == "auto":
            maintenance_event_url = GCE_MAINTENANCE_EVENT_URL if on_google_cloud() else None
        if maintenance_event_url:
            threading.Thread(
                target=self._poll,
                args=(maintenance_event_url, poll_seconds),
                name="maintenance-event-poller",
                daemon=True,
            ).start()

    def _install_handler(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        del frame
        name = signal.Signals(signum).name
        if self.signal_name is not None and self._end_start_up is None:
            _say(
                f"{name} while the run is already stopping: it saves its checkpoint, then "
                "exits (SIGKILL would lose the steps since the last checkpoint)"
            )
            return
        self.signal_name = name
        if self._end_start_up is not None:
            try:
                self._end_start_up(self.signal_name)
            finally:
                for stream in (sys.stdout, sys.stderr):
                    try:
                        stream.flush()
                    except Exception:  # noqa: BLE001 - e.g. a write the signal interrupted
                        pass
                os._exit(0)

    def started(self) -> None:
        """Training has begun: from now on a signal stops the run at the next step boundary
        (with a checkpoint) instead of ending start-up at once."""
        self._end_start_up = None

    def _poll(self, url: str, poll_seconds: float) -> None:
        while not self._closed.wait(poll_seconds):
            event = read_maintenance_event(url)
            if event in (None, _NO_EVENT):
                continue
            self.signal_name = f"maintenance event {event}"
            if self._multi_process:  # tell the coordination service, which tells every process
                os.kill(os.getpid(), signal.SIGTERM)
            return

    def should_stop(self, step: int) -> bool:
        if self._multi_process:
            try:
                from jax.experimental import multihost_utils

                if multihost_utils.reached_preemption_sync_point(step):
                    self.signal_name = self.signal_name or "preemption notice (SIGTERM)"
                    return True
                return False
            except RuntimeError:  # no preemption service in this jax.distributed set-up
                self._multi_process = False
                self._install_handler()
        return self.signal_name is not None

    def close(self) -> None:
        self._closed.set()
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None
