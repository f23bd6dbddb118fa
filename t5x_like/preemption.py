"""Stop cleanly when the machine is about to go away: SIGTERM (what a spot/preemptible VM, a
SLURM time limit, `kill` or Kubernetes send first) or a TPU maintenance event.

One process: a SIGTERM handler sets a flag and the training loop, at the next step boundary,
saves a checkpoint at that step and returns normally (exit code 0), so rerunning the same
command resumes there. Several processes: jax's preemption sync point
(`multihost_utils.reached_preemption_sync_point`, fed by the coordination service, which also
forwards TPU maintenance notices) makes every process stop at the same step, as orbax's
checkpointing of a sharded state requires.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

import jax


class PreemptionWatcher:
    """`should_stop(step)` after each step; `close()` restores the previous SIGTERM handler."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous = None
        self._multi_process = jax.process_count() > 1
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        del frame
        self.signal_name = signal.Signals(signum).name

    def should_stop(self, step: int) -> bool:
        if self._multi_process:
            try:
                from jax.experimental import multihost_utils

                if multihost_utils.reached_preemption_sync_point(step):
                    self.signal_name = self.signal_name or "preemption notice"
                    return True
                return False
            except RuntimeError:  # no preemption service in this jax.distributed set-up
                pass
        return self.signal_name is not None

    def close(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None
