"""Train-state checkpoints: the parameters, optimizer state, model config and run record of
each saved step in `MODEL_DIR/checkpoints`, through orbax's CheckpointManager (asynchronous
saves, keep N, restore onto any mesh), each step sealed by a manifest of its files' sizes and
CRC-32s so that a damaged step is named before any array is read.
"""

from __future__ import annotations

import errno
import json
import os
import re
from typing import Any, Iterator, NoReturn

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from t5x_like import storage
from t5x_like.checkpoints import params_io
from t5x_like.errors import CheckpointUnreadable, CheckpointWriteFailed
from t5x_like.trainer import TrainState


def _size(n: int | None) -> str:
    if n is None:
        return "unknown"
    return f"{n / 2**20:,.1f} MiB" if n < 2**30 else f"{n / 2**30:,.2f} GiB"


_DISK_FULL_SIGNS = ("No space left", "RESOURCE_EXHAUSTED", "ENOSPC", "Disk quota exceeded")


def _causes(error: BaseException | None) -> Iterator[BaseException]:
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


class Checkpointer:
    """Train-state checkpoints in `model_dir/checkpoints`, with the model config and the run's
    record (data order, skipped steps) beside them.

    Crash safety: saves are asynchronous, and orbax writes each step to a temporary directory
    that is renamed (or, on buckets, marked committed) only when complete, so a run killed
    mid-save leaves nothing a restore would pick up; the leftover is reported
    (`interrupted_saves`) and removed. Each step carries a manifest of its files' sizes and
    CRC-32s, written into it just before orbax commits it, so no committed step lacks one. (A
    step without one newer than the newest step with one, as older versions of this code could
    leave, is reported in `unverified_saves` and removed like an interrupted save; the run
    resumes from the newest verified step, and the same batches follow.) A restore checks every
    file against the manifest first, so a
    truncated, missing or altered file is named before any array is read, and a damaged step
    is never trained on.

    Pruning (`keep`) counts verified steps only, and runs after a newer step is verified: an
    intact step is never deleted while the steps that would replace it are unchecked.
    """

    MANIFEST = "t5x_like_manifest.json"
    _TMP_MARKER = ".orbax-checkpoint-tmp"
    # orbax's own bookkeeping, which its commit updates after the manifest is written.
    _REWRITTEN_AT_COMMIT = ("_CHECKPOINT_METADATA", "commit_success.txt")

    def __init__(self, model_dir: str, keep: int | None) -> None:
        self.directory = os.path.join(storage.resolve(model_dir), "checkpoints")
        # Seen before orbax removes them (cleanup_tmp_directories).
        self.interrupted_saves = sorted(
            name.rstrip("/") for name in storage.listdir(self.directory) if self._TMP_MARKER in name
        )
        self.keep = keep
        self._saving: int | None = None  # the step whose save is in flight (or was last)
        self._in_flight: int | None = None  # ... until it is waited for
        self._manifest_error: BaseException | None = None
        self.manager = params_io.orbax_manager(
            self.directory,
            max_to_keep=None,
            create=True,
            enable_async_checkpointing=True,
            cleanup_tmp_directories=True,
            async_options=ocp.AsyncOptions(post_finalization_callback=self._write_manifest),
        )
        self._checked: set[int] = set()  # steps verified against their manifest
        self.unverified_saves = self._remove_unverified_steps()

    def _step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def _has_manifest(self, step: int) -> bool:
        return storage.exists(os.path.join(self._step_dir(step), self.MANIFEST))

    def _remove_unverified_steps(self) -> list[int]:
        """Steps committed by orbax but cut off before their manifest (newer than the newest
        verified step; a directory with no manifest at all predates manifests and is kept)."""
        steps = self.steps()
        verified = [s for s in steps if self._has_manifest(s)]
        unverified = [s for s in steps if verified and s > verified[-1]]
        for step in unverified:
            self.manager.delete(step)
        return unverified

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, state: TrainState, config: Any, record: dict | None = None) -> int | None:
        """Save now (asynchronously); the caller decides when. `record` is small JSON about
        the run (`restore_record`). Returns the step of the previous save if it completed
        only now (so a log can say "saved" once it is true)."""
        finished = self._finish_previous_save()
        step = int(state.step)
        self._saving = self._in_flight = step
        try:
            self.manager.save(
                step,
                force=True,
                args=ocp.args.Composite(
                    params=ocp.args.StandardSave(state.params),
                    opt_state=ocp.args.StandardSave(state.opt_state),
                    config=ocp.args.JsonSave(config.to_json()),
                    run=ocp.args.JsonSave(dict(record or {})),
                ),
            )
        except Exception as e:  # noqa: BLE001 - orbax/tensorstore fail in many ways
            self._write_failed(step, e)
        return finished

    def _write_manifest(self) -> None:
        """orbax's post-finalization callback, in its background thread, which orbax runs after
        every file of the step is written and before it commits the step (renames the
        temporary directory, or writes the bucket's commit file): the manifest of sizes and
        CRC-32s lands in the step as part of its commit. A failure is raised in the main
        thread at the next save."""
        step = self._saving
        try:
            if step is not None and jax.process_index() == 0:
                step_dir = self._uncommitted_dir(step)
                digests = {
                    name: entry
                    for name, entry in storage.file_digests(step_dir).items()
                    if os.path.basename(name) not in self._REWRITTEN_AT_COMMIT
                }
                storage.write_text(
                    os.path.join(step_dir, self.MANIFEST),
                    json.dumps({"step": step, "files": digests}),
                )
        except BaseException as e:  # noqa: BLE001 - reported by _finish_previous_save
            self._manifest_error = e

    def _uncommitted_dir(self, step: int) -> str:
        """Where orbax is writing `step` before its commit: `<step>.orbax-checkpoint-tmp-*`
        on disk, the step's own directory on a bucket (committed by a marker file)."""
        pending = [
            name.rstrip("/")
            for name in storage.listdir(self.directory)
            if name.startswith(f"{step}{self._TMP_MARKER}")
        ]
        return os.path.join(self.directory, pending[0]) if pending else self._step_dir(step)

    def _finish_previous_save(self) -> int | None:
        """Wait for the save in flight (orbax would before starting the next one anyway), then
        prune: the step just saved is verified, so older ones may go. Returns that step."""
        try:
            self.manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001 - the background write's failure, re-raised
            self._write_failed(self._in_flight, e)
        finished, self._in_flight = self._in_flight, None
        error, self._manifest_error = self._manifest_error, None
        if error is not None:
            raise CheckpointUnreadable(
                f"The checkpoint of step {self._saving} was written but its manifest could "
                f"not be ({type(error).__name__}: {error}); the step would not be trusted on "
                f"resume. Check that {self.directory} is writable and has space."
            ) from error
        self._prune()
        return finished

    def _write_failed(self, step: int | None, error: BaseException) -> None:
        """One message for a failed save, whatever orbax's background threads raised (on a
        full disk: "Event loop is closed" first, the cause buried), naming the cause, the
        space and what to do. Nothing is lost: the step was never committed."""
        self._in_flight = None
        verified = [s for s in self.steps() if s != step and self._has_manifest(s)]
        needed = self._step_bytes(verified[-1]) if verified else None
        free = storage.free_bytes(self.directory)
        text = " | ".join(f"{type(c).__name__}: {c}" for c in _causes(error))
        full = (
            any(isinstance(c, OSError) and c.errno == errno.ENOSPC for c in _causes(error))
            or any(sign in text for sign in _DISK_FULL_SIGNS)
            or (free is not None and needed is not None and free < needed)
        )
        if full:
            why = (
                f"the disk is full ({_size(free)} free"
                + (f"; a checkpoint needs about {_size(needed)}" if needed else "")
                + ")"
            )
        else:
            first_line = (str(error).splitlines() or [""])[0][:300]
            why = f"{type(error).__name__}: {first_line}"
        resume = (
            f"Checkpoints up to step {verified[-1]} are intact: free space (or move "
            "MODEL_DIR, or lower --gin.Checkpointing.keep) and rerun the same command "
            f"to resume from step {verified[-1]}."
            if verified
            else "No earlier checkpoint exists: free space and rerun."
        )
        raise CheckpointWriteFailed(
            f"Saving the checkpoint of step {step} to {self.directory} failed: {why}. {resume}"
        ) from error

    def _step_bytes(self, step: int) -> int | None:
        try:
            files = json.loads(
                storage.read_text(os.path.join(self._step_dir(step), self.MANIFEST))
            )["files"]
            return sum(e["size"] if isinstance(e, dict) else int(e) for e in files.values())
        except (ValueError, KeyError, TypeError, *storage.ERRORS):
            return None

    def _prune(self) -> None:
        if not self.keep:
            return
        verified = [s for s in self.steps() if self._has_manifest(s)]
        for step in verified[: -self.keep]:
            self.manager.delete(step)

    def check_complete(self, step: int) -> None:
        """Every file the manifest lists exists with its size and CRC-32; raises
        CheckpointUnreadable naming the first that does not. (Steps saved before manifests
        existed are not checked; manifests from before checksums check sizes.)"""
        if step in self._checked:
            return
        step_dir = self._step_dir(step)
        manifest = os.path.join(step_dir, self.MANIFEST)
        if not storage.exists(manifest):
            return
        try:
            listed = json.loads(storage.read_text(manifest))["files"]
            listed = {
                name: entry if isinstance(entry, dict) else {"size": int(entry)}
                for name, entry in listed.items()
            }
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            self._unreadable(step, manifest, f"the manifest is not readable ({e})")
        actual = storage.file_sizes(step_dir)
        for name, entry in listed.items():
            path = os.path.join(step_dir, name)
            if name not in actual:
                self._unreadable(step, path, "the file is missing")
            if actual[name] != entry["size"]:
                self._unreadable(
                    step, path, f"{actual[name]:,} bytes where {entry['size']:,} were written"
                )
            if "crc32" in entry and storage.file_crc32(path) != entry["crc32"]:
                self._unreadable(
                    step,
                    path,
                    "its bytes differ from those written (CRC-32 "
                    "mismatch: the file was altered or corrupted on disk)",
                )
        self._checked.add(step)

    def _unreadable(self, step: int, path: str, why: str) -> NoReturn:
        earlier = [s for s in self.steps() if s < step]
        hint = (
            f"Move {self._step_dir(step)} aside and rerun to resume "
            f"from step {earlier[-1]}, the newest earlier checkpoint."
            if earlier
            else "No earlier checkpoint is left: start a new MODEL_DIR."
        )
        raise CheckpointUnreadable(
            f"The checkpoint of step {step} is damaged: {path}: {why}. " + hint
        )

    def _restore(self, step: int, **items) -> dict:
        """orbax's restore, with any failure turned into CheckpointUnreadable naming the
        step and (where the error says) the file."""
        self.check_complete(step)
        try:
            return self.manager.restore(step, args=ocp.args.Composite(**items))
        except Exception as e:  # noqa: BLE001 - tensorstore/json/orbax all fail differently
            named = re.search(r'local file "([^"]+)"', str(e))
            path = (
                named.group(1)
                if named
                else os.path.join(self.directory, str(step), "/".join(items))
            )
            self._unreadable(step, path, f"{type(e).__name__}: {str(e).split(' [')[0][:300]}")

    def _step_or_latest(self, step: int | None) -> int:
        if step is None:
            step = self.latest_step()
        if step is None:
            raise CheckpointUnreadable(f"No checkpoint in {self.directory} to restore.")
        return step

    def restore(self, abstract: TrainState, step: int | None = None) -> TrainState:
        """Restore onto the shardings carried by `abstract` (ShapeDtypeStructs): orbax reads
        each device's shards, whatever mesh the checkpoint was written from."""
        step = self._step_or_latest(step)
        restored = self._restore(
            step,
            params=ocp.args.StandardRestore(abstract.params),
            opt_state=ocp.args.StandardRestore(abstract.opt_state),
        )
        return TrainState(jnp.array(step, jnp.int32), restored["params"], restored["opt_state"])

    def restore_config(self, step: int | None = None) -> Any:
        step = self._step_or_latest(step)
        return params_io.config_from_json(
            self._restore(step, config=ocp.args.JsonRestore())["config"]
        )

    def restore_record(self, step: int) -> dict:
        """The run record saved with `step` ({} for checkpoints written before records)."""
        if not storage.exists(os.path.join(self.directory, str(step), "run")):
            return {}
        return dict(self._restore(step, run=ocp.args.JsonRestore())["run"])

    def close(self) -> int | None:
        """Finish the save in flight (returning its step, as `save` does) and stop."""
        finished = self._finish_previous_save()
        self.manager.close()
        return finished
