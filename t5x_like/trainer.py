"""The training step, the evaluation step and the train state's checkpoints.

`make_layout` decides where the train state lives (mesh, rules, shardings); `make_train_step`
(loss, gradients with optional micro-batch accumulation, optax update, metrics) and
`make_eval_step` (metric sums) are jitted with those shardings explicitly; `Checkpointer` wraps
orbax's CheckpointManager (async saves, keep N, restore onto any mesh).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
from typing import Any, Callable, Iterator

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from jax.sharding import Mesh

from t5x_like import optimizers, partitioning, storage
from t5x_like.checkpoints import params_io
from t5x_like.errors import CheckpointUnreadable, CheckpointWriteFailed, ConfigError
from t5x_like.models import base
from t5x_like.models.base import Model, unbox

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    opt_state: Any


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where everything lives: the mesh, the logical-axis rules and the train state's
    shardings (parameters from their logical axes, optimizer state derived from them)."""

    mesh: Mesh
    rules: partitioning.Rules
    state_shardings: TrainState
    boxed_params: Any  # abstract, with logical axis names (for reports)

    @property
    def batch_sharding(self):
        return partitioning.batch_sharding(self.mesh, self.rules)

    def global_batch(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """This process's rows -> global arrays split over the layout's batch axes."""
        return partitioning.global_batch(batch, self.mesh, self.rules)

    @property
    def replicated(self):
        return partitioning.replicated(self.mesh)

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        """Mesh and rules in scope, so the model's activation constraints apply when traced."""
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(list(self.rules)):
            yield


def make_layout(
    model: Model, optimizer: optax.GradientTransformation, mesh: Mesh, rules: partitioning.Rules
) -> Layout:
    """Shardings of the whole train state, from abstract shapes only (nothing allocated)."""
    boxed = model.abstract_params()
    param_shardings = partitioning.param_shardings(boxed, mesh, rules)
    params = unbox(boxed)
    opt_state = jax.eval_shape(optimizer.init, params)
    opt_shardings = partitioning.derived_shardings(opt_state, params, param_shardings, mesh)
    shardings = TrainState(partitioning.replicated(mesh), param_shardings, opt_shardings)
    return Layout(mesh, tuple(rules), shardings, boxed)


def abstract_state(
    model: Model, optimizer: optax.GradientTransformation, layout: Layout
) -> TrainState:
    """ShapeDtypeStructs of the train state, carrying their shardings."""
    params = unbox(layout.boxed_params)
    state = TrainState(
        jax.ShapeDtypeStruct((), jnp.int32), params, jax.eval_shape(optimizer.init, params)
    )
    return jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        state,
        layout.state_shardings,
    )


def init_state(
    model: Model, optimizer: optax.GradientTransformation, rng: jax.Array, layout: Layout
) -> TrainState:
    """Fresh parameters and optimizer state, each created directly on its shards."""

    def init(rng):
        params = unbox(model.init(rng))
        return TrainState(jnp.array(0, jnp.int32), params, optimizer.init(params))

    with layout.context():
        return jax.jit(init, out_shardings=layout.state_shardings)(rng)


def state_from_params(
    params: Any, optimizer: optax.GradientTransformation, layout: Layout
) -> TrainState:
    """Step 0 with given (e.g. pretrained) parameters and a fresh optimizer state, sharded."""

    def init(params):
        return TrainState(jnp.array(0, jnp.int32), params, optimizer.init(params))

    with layout.context():
        return jax.jit(init, out_shardings=layout.state_shardings)(params)


def _split_microbatches(batch: Batch, num_microbatches: int) -> Batch:
    """(B, ...) -> (k, B/k, ...) taking every k-th row, so each micro-batch draws rows from
    every data shard alike."""

    def split(x):
        x = x.reshape(x.shape[0] // num_microbatches, num_microbatches, *x.shape[1:])
        return jnp.swapaxes(x, 0, 1)

    return jax.tree_util.tree_map(split, batch)


NONFINITE_POLICIES = ("stop", "skip", "none")


def make_train_step(
    model: Model,
    optimizer: optax.GradientTransformation,
    learning_rate_fn: optax.Schedule,
    layout: Layout,
    num_microbatches: int = 1,
    nonfinite_policy: str = "stop",
    inject_nonfinite_at_steps: tuple[int, ...] = (),
) -> jax.stages.Wrapped:
    """Jitted step with explicit shardings: (state, batch, rng) -> (state, metrics). Gradients
    of the summed loss are accumulated over `num_microbatches` and normalised once by the whole
    batch's normaliser, so accumulation equals the full-batch step. The dropout rng is folded
    with the step (and micro-batch), so a resumed run draws the same masks.

    Non-finite guard: when the loss or the gradient norm is NaN/Inf the step keeps the old
    parameters and optimizer state (metric `nonfinite` = 1). Under "skip" the step counter
    still advances (the batch is dropped and training goes on); under "stop" it does not, so
    the returned state is the last good one, to be saved before stopping. "none" applies
    whatever the update is. `inject_nonfinite_at_steps` is a fault hook for tests and drills:
    the steps (numbered as logged, 1 = the first update) whose gradients and loss become NaN.
    """
    if nonfinite_policy not in NONFINITE_POLICIES:
        raise ConfigError(
            f"train.nonfinite_policy={nonfinite_policy!r}: choose one of "
            f"{', '.join(NONFINITE_POLICIES)}."
        )

    def grads_and_sums(params, batch, rng):
        # Divisors from the whole batch, so each micro-batch's gradient is already its share
        # of the full-batch gradient and the shares simply add up.
        denominators = model.loss_denominators(batch)

        def objective(p, b, r):
            sums = model.loss_sums(p, b, r)
            return base.objective(sums, denominators), sums

        grad_fn = jax.grad(objective, has_aux=True)
        if num_microbatches <= 1:
            return grad_fn(params, batch, rng)
        # Each micro-batch must still split evenly over the data-parallel devices: XLA pads
        # an uneven split, and with padded shards its partitioner has produced wrong
        # gradients (model-parallel mesh, 2 rows over 4 data shards) with no error.
        rows = jax.tree_util.tree_leaves(batch)[0].shape[0]
        partitioning.check_batch_size(rows, layout.mesh, num_microbatches, layout.rules)
        micro = _split_microbatches(batch, num_microbatches)

        def accumulate(carry, inputs):
            grads, sums = carry
            mb, index = inputs
            g, s = grad_fn(params, mb, jax.random.fold_in(rng, index))
            return (
                jax.tree_util.tree_map(jnp.add, grads, g),
                jax.tree_util.tree_map(jnp.add, sums, s),
            ), None

        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        first = jax.tree_util.tree_map(lambda x: x[0], micro)
        zero_sums = jax.tree_util.tree_map(
            lambda x: jnp.zeros(x.shape, x.dtype),
            jax.eval_shape(model.loss_sums, params, first, rng),
        )
        (grads, sums), _ = jax.lax.scan(
            accumulate, (zeros, zero_sums), (micro, jnp.arange(num_microbatches))
        )
        return grads, sums

    def train_step(state: TrainState, batch: Batch, rng: jax.Array):
        dropout_rng = jax.random.fold_in(rng, state.step)
        grads, sums = grads_and_sums(state.params, batch, dropout_rng)
        metrics = model.metrics(sums)
        if inject_nonfinite_at_steps:
            fault = jnp.where(
                jnp.isin(state.step + 1, jnp.asarray(inject_nonfinite_at_steps)), jnp.nan, 1.0
            )
            grads = jax.tree_util.tree_map(lambda g: g * fault.astype(g.dtype), grads)
            metrics["loss"] = metrics["loss"] * fault
        grad_norm = optimizers.global_norm(grads)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        step = state.step + 1
        finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
        if nonfinite_policy != "none":
            keep_old = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
            params = jax.tree_util.tree_map(keep_old, params, state.params)
            opt_state = jax.tree_util.tree_map(keep_old, opt_state, state.opt_state)
            if nonfinite_policy == "stop":
                step = jnp.where(finite, step, state.step)
        metrics = {
            **metrics,
            "learning_rate": learning_rate_fn(state.step),
            "grad_norm": grad_norm,
            "param_norm": optimizers.global_norm(params),
            "nonfinite": (~finite).astype(jnp.int32),
        }
        return TrainState(step, params, opt_state), metrics

    return jax.jit(
        train_step,
        in_shardings=(layout.state_shardings, layout.batch_sharding, layout.replicated),
        out_shardings=(layout.state_shardings, layout.replicated),
        donate_argnums=(0,),
    )


def make_eval_step(model: Model, layout: Layout) -> Callable[[Any, Batch], Metrics]:
    """Jitted metric sums for one batch (summed over batches, divided at the end)."""
    return jax.jit(
        model.loss_sums,
        in_shardings=(layout.state_shardings.params, layout.batch_sharding),
        out_shardings=layout.replicated,
    )


def _size(n: int | None) -> str:
    if n is None:
        return "unknown"
    return f"{n / 2**20:,.1f} MiB" if n < 2**30 else f"{n / 2**30:,.2f} GiB"


_DISK_FULL_SIGNS = ("No space left", "RESOURCE_EXHAUSTED", "ENOSPC", "Disk quota exceeded")


def _causes(error: BaseException) -> Iterator[BaseException]:
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
            "MODEL_DIR, or lower --gin.train.keep_checkpoints) and rerun the same command "
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

    def _unreadable(self, step: int, path: str, why: str) -> None:
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

    def restore(self, abstract: TrainState, step: int | None = None) -> TrainState:
        """Restore onto the shardings carried by `abstract` (ShapeDtypeStructs): orbax reads
        each device's shards, whatever mesh the checkpoint was written from."""
        step = self.latest_step() if step is None else step
        restored = self._restore(
            step,
            params=ocp.args.StandardRestore(abstract.params),
            opt_state=ocp.args.StandardRestore(abstract.opt_state),
        )
        return TrainState(jnp.array(step, jnp.int32), restored["params"], restored["opt_state"])

    def restore_config(self, step: int | None = None) -> Any:
        step = self.latest_step() if step is None else step
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
