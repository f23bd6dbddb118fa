"""The training input as one deterministic, step-indexed stream of global batches.

Exact resume needs the batch of step s to be a function of the run's configuration and s
only, whatever happened before and however many hosts read it. So the data is cut into a
fixed number of *data shards* (`Data.shards`, saved in the checkpoint): shard j is
seqio's pipeline over the source's examples j, j + S, j + 2S, ... with the run's seed, and
fills rows [j*B/S, (j+1)*B/S) of every global batch of B rows. A host reads the shards that
cover its rows (S / hosts of them), so resuming on 4 hosts a run started on 1 (or the other
way round) feeds the model the same global batches. A run that resumes at step s starts each
of its shards at batch s. Each checkpoint saves every shard's tf.data iterator beside it
(`HostBatches.save`: shuffle buffers, packing state and source positions, a few MB per shard),
so a resume restores the shards where they were, whichever process wrote them; without such a
state (a checkpoint from before this, or one saved at another position) it falls back to
`Dataset.skip`, which re-reads, but does not train on, every batch before s: O(s), hours late
in a long run.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import TYPE_CHECKING, Iterator, Mapping

import jax
import numpy as np
import seqio
import tensorflow as tf

from t5x_like import input_pipeline, storage
from t5x_like.errors import ConfigError

if TYPE_CHECKING:
    from t5x_like.models.base import Model


@dataclasses.dataclass(frozen=True)
class DataOrder:
    """What fixes the global sequence of training batches (saved beside each checkpoint)."""

    task: str
    batch_size: int
    seed: int
    data_shards: int

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def resolve_data_shards(
    data_shards: int | None, batch_size: int, process_count: int, saved: DataOrder | None = None
) -> int:
    """The number of data shards: the checkpoint's on resume (the stream must not change),
    else the configured one, else one per process; checked against batch size and hosts."""
    if saved is not None:
        if data_shards not in (None, saved.data_shards):
            raise ConfigError(
                f"Data.shards={data_shards}, but the run being resumed reads its data in "
                f"{saved.data_shards} shards; a different count would change which examples "
                f"it sees. Drop the binding (or set it to {saved.data_shards})."
            )
        data_shards = saved.data_shards
    data_shards = process_count if data_shards is None else int(data_shards)
    if data_shards < 1 or batch_size % data_shards:
        raise ConfigError(
            f"Data.shards={data_shards} must be >= 1 and divide "
            f"Data.batch_size={batch_size} (each shard fills an equal block of "
            "rows of every batch)."
        )
    if data_shards % process_count:
        raise ConfigError(
            f"This run reads its data in {data_shards} shards, which {process_count} processes "
            f"cannot split evenly. Run on a number of hosts that divides {data_shards}"
            + (
                " (the count is fixed when a run starts: set Data.shards to a multiple of "
                "every host count you may use)."
                if saved is not None
                else ", or set Data.shards to a multiple of the process count."
            )
        )
    return data_shards


def shards_of_process(data_shards: int, process_index: int, process_count: int) -> range:
    """The data shards whose rows this process feeds (a contiguous block: the process's rows
    of the global batch are a contiguous block too)."""
    per_process = data_shards // process_count
    return range(process_index * per_process, (process_index + 1) * per_process)


def _concat_rows(*parts: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    return {k: tf.concat([p[k] for p in parts], axis=0) for k in parts[0]}


def _shard_datasets(
    order: DataOrder,
    feature_lengths: Mapping[str, int],
    pack: bool,
    model: Model,
    process_index: int | None,
    process_count: int | None,
    task: input_pipeline.TaskLike | None = None,
) -> dict[int, tf.data.Dataset]:
    """{shard index: its endless stream of batches of B / S rows} for this process's shards,
    of `task` (the run's resolved task; `order.task`, its name, when not given)."""
    provider = input_pipeline.resolve_task(order.task if task is None else task)
    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
    rows_per_shard = order.batch_size // order.data_shards
    return {
        j: input_pipeline.get_dataset(
            provider,
            feature_lengths,
            rows_per_shard,
            "train",
            shuffle=True,
            seed=order.seed,
            num_epochs=None,
            pack=pack,
            model=model,
            shard_info=seqio.ShardInfo(index=j, num_shards=order.data_shards),
        )
        for j in shards_of_process(order.data_shards, process_index, process_count)
    }


def host_dataset(
    order: DataOrder,
    feature_lengths: Mapping[str, int],
    *,
    start_batch: int = 0,
    pack: bool = True,
    model: Model,
    process_index: int | None = None,
    process_count: int | None = None,
    task: input_pipeline.TaskLike | None = None,
) -> tf.data.Dataset:
    """This process's rows of global batches start_batch, start_batch + 1, ... (endless)."""
    shards = list(
        _shard_datasets(
            order, feature_lengths, pack, model, process_index, process_count, task
        ).values()
    )
    ds = shards[0] if len(shards) == 1 else tf.data.Dataset.zip(tuple(shards)).map(_concat_rows)
    return ds.skip(start_batch) if start_batch else ds


class HostBatches(Iterator[dict[str, np.ndarray]]):
    """Numpy batches of `host_dataset` for the training loop, one iterator per data shard so
    that each shard's position can be saved with a checkpoint and restored by whichever
    process reads that shard on resume (the host count may change between runs).

    `restore_from`: a directory `save` wrote; used when it holds every shard of this process
    at exactly `start_batch` for the same data order, lengths and packing, else the stream
    starts by skipping (`how_started` says which, and why). `task`: the run's resolved task
    (`order.task` names it; given, it is not looked up again).
    """

    def __init__(
        self,
        order: DataOrder,
        feature_lengths: Mapping[str, int],
        *,
        start_batch: int = 0,
        pack: bool = True,
        model: Model,
        restore_from: str | None = None,
        process_index: int | None = None,
        process_count: int | None = None,
        task: input_pipeline.TaskLike | None = None,
    ) -> None:
        self.position = start_batch
        self._describe = {
            "order": order.to_json(),
            "feature_lengths": dict(feature_lengths),
            "pack": pack,
        }
        datasets = _shard_datasets(
            order, feature_lengths, pack, model, process_index, process_count, task
        )
        why_not = (
            self._restore(datasets, restore_from)
            if restore_from and start_batch
            else "nothing to restore"
        )
        if why_not is None:
            self.how_started = f"restored from {restore_from}"
        else:
            self._iterators = {
                j: iter(ds.skip(start_batch) if start_batch else ds) for j, ds in datasets.items()
            }
            self.how_started = f"skipped {start_batch} batches ({why_not})"

    def _descriptor(self) -> dict:
        return {"position": self.position, **self._describe}

    def _restore(self, datasets: Mapping[int, tf.data.Dataset], directory: str) -> str | None:
        """Restore every shard's iterator from `directory`; None, or why it could not."""
        iterators = {}
        for j, ds in datasets.items():
            descriptor_path = os.path.join(directory, f"shard_{j}.json")
            if not storage.exists(descriptor_path):
                return f"no saved position of data shard {j} in {directory}"
            saved = json.loads(storage.read_text(descriptor_path))
            if saved != self._descriptor():
                return (
                    f"the position saved in {descriptor_path} is of another stream or step: {saved}"
                )
            iterators[j] = iter(ds)
            try:
                tf.train.Checkpoint(iterator=iterators[j]).read(
                    os.path.join(directory, f"shard_{j}")
                ).assert_consumed()
            except (tf.errors.OpError, AssertionError, ValueError) as e:
                return f"restoring data shard {j} failed: {type(e).__name__}: {str(e)[:300]}"
        self._iterators = iterators
        return None

    def __next__(self) -> dict[str, np.ndarray]:
        parts = [{k: v.numpy() for k, v in next(it).items()} for it in self._iterators.values()]
        self.position += 1
        return (
            parts[0]
            if len(parts) == 1
            else {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        )

    def save(self, directory: str) -> str | None:
        """Save each shard's iterator and position under `directory`; None, or why not (a
        pipeline TensorFlow cannot checkpoint, a full disk). The position file is written
        last and removed first, so one that exists describes complete iterator files."""
        try:
            for j, iterator in self._iterators.items():
                descriptor_path = os.path.join(directory, f"shard_{j}.json")
                if storage.exists(descriptor_path):
                    storage.remove(descriptor_path)
                tf.train.Checkpoint(iterator=iterator).write(os.path.join(directory, f"shard_{j}"))
                storage.write_text(descriptor_path, json.dumps(self._descriptor()))
        except (tf.errors.OpError, ValueError, OSError) as e:
            return f"{type(e).__name__}: {str(e)[:300]}"
        return None
