"""One run per MODEL_DIR: a lock file names the run holding the directory.

Two runs writing one MODEL_DIR (a second launch by mistake, a restart while the first is still
alive) would interleave their checkpoints into a mix of both. The first run takes
`MODEL_DIR/RUN_LOCK.json` (host, pid, start time, a heartbeat it refreshes); a second is
refused with the holder's identity. A lock left by a dead run is taken over: on the same host
when its pid is gone, elsewhere when its heartbeat is older than `stale_after_s`.

Local disks create the file atomically (O_EXCL). Buckets (`gs://`) have no atomic create
through TensorFlow's file API, so there the run writes its lease, waits `settle_s` and reads
it back: of two runs starting within that window, the later write wins and the other sees a
lease that is not its own and stops.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import threading
import time
import uuid

from t5x_like import storage
from t5x_like.errors import ModelDirInUse

LOCK_FILE = "RUN_LOCK.json"
HEARTBEAT_S = 60.0
STALE_AFTER_S = 600.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


@dataclasses.dataclass
class RunLock:
    """The lock this run holds; `release()` removes it (only if it is still ours)."""

    path: str
    token: str
    _stop: threading.Event = dataclasses.field(default_factory=threading.Event)

    def _lease(self, started: float) -> str:
        return json.dumps(
            {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "started": started,
                "heartbeat": time.time(),
                "token": self.token,
            }
        )

    def start_heartbeat(self, started: float, every_s: float) -> None:
        def beat() -> None:
            while not self._stop.wait(every_s):
                try:
                    if _read(self.path).get("token") == self.token:
                        storage.write_text(self.path, self._lease(started))
                except storage.ERRORS:
                    pass  # a missed beat only makes the lock look older

        threading.Thread(target=beat, name="run-lock-heartbeat", daemon=True).start()

    def release(self) -> None:
        self._stop.set()
        try:
            if _read(self.path).get("token") == self.token:
                storage.remove(self.path)
        except storage.ERRORS:
            pass


def _read(path: str) -> dict:
    try:
        return json.loads(storage.read_text(path))
    except (ValueError, *storage.ERRORS):
        return {}


def _stale(holder: dict, stale_after_s: float) -> str | None:
    """Why a holder's lock may be taken over, or None if the holder may still run."""
    if not holder:
        return "the lock file is unreadable"
    if holder.get("host") == socket.gethostname() and not _alive(int(holder.get("pid", -1))):
        return f"process {holder.get('pid')} on this host is gone"
    age = time.time() - float(holder.get("heartbeat", 0))
    if age > stale_after_s:
        return f"its last heartbeat was {age:.0f} s ago (more than {stale_after_s:.0f} s)"
    return None


def _describe(holder: dict) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("started", 0))))
    return f"process {holder.get('pid')} on host {holder.get('host')}, started {started}"


def _refuse(model_dir: str, path: str, holder: dict, stale_after_s: float) -> ModelDirInUse:
    return ModelDirInUse(
        f"MODEL_DIR {model_dir} is in use by another run ({_describe(holder)}): two runs on one "
        f"directory would mix their checkpoints. Stop that run first, or use another "
        f"--gin.MODEL_DIR. If it is dead, its lock {path} is taken over once its heartbeat is "
        f"{stale_after_s:.0f} s old (or delete the file)."
    )


def acquire(
    model_dir: str,
    *,
    stale_after_s: float = STALE_AFTER_S,
    heartbeat_s: float = HEARTBEAT_S,
    settle_s: float = 2.0,
) -> RunLock:
    """Take MODEL_DIR for this run, or raise ModelDirInUse naming the holder."""
    path = os.path.join(model_dir, LOCK_FILE)
    lock, started = RunLock(path, uuid.uuid4().hex), time.time()
    holder = _read(path) if storage.exists(path) else None
    if holder is not None:
        why = _stale(holder, stale_after_s)
        if why is None:
            raise _refuse(model_dir, path, holder, stale_after_s)
        print(f"Taking over the lock of a dead run ({_describe(holder)}): {why}.", flush=True)
        storage.remove(path)
    if storage.is_remote(path):
        storage.write_text(path, lock._lease(started))
        time.sleep(settle_s)
        holder = _read(path)
        if holder.get("token") != lock.token:
            raise _refuse(model_dir, path, holder, stale_after_s)
    else:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            raise _refuse(model_dir, path, _read(path), stale_after_s) from None
        with os.fdopen(fd, "w") as f:
            f.write(lock._lease(started))
    lock.start_heartbeat(started, heartbeat_s)
    return lock
