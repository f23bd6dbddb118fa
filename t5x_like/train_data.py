"""The training input as one deterministic, step-indexed stream of global batches.

Exact resume needs the batch of step s to be a function of the run's configuration and s
only, whatever happened before and however many hosts read it. So the data is cut into a
fixed number of *data shards* (`train.data_shards`, saved in the checkpoint): shard j is
seqio's pipeline over the source's examples j, j + S, j + 2S, ... with the run's seed, and
fills rows [j*B/S, (j+1)*B/S) of every global batch of B rows. A host reads the shards that
cover its rows (S / hosts of them), so resuming on 4 hosts a run started on 1 (or the other
way round) feeds the model the same global batches. A run that resumes at step s starts each
of its shards at batch s (`Dataset.skip`: the input pipeline re-reads, but does not train on,
the batches before it).
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Mapping

import jax
import numpy as np
import seqio
import tensorflow as tf

from t5x_like import input_pipeline
from t5x_like.config import ConfigError


@dataclasses.dataclass(frozen=True)
class DataOrder:
    """What fixes the global sequence of training batches (saved beside each checkpoint)."""

    task: str
    batch_size: int
    seed: int
    data_shards: int

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def resolve_data_shards(data_shards: int | None, batch_size: int, process_count: int,
                        saved: DataOrder | None = None) -> int:
    """The number of data shards: the checkpoint's on resume (the stream must not change),
    else the configured one, else one per process; checked against batch size and hosts."""
    if saved is not None:
        if data_shards not in (None, saved.data_shards):
            raise ConfigError(
                f"train.data_shards={data_shards}, but the run being resumed reads its data in "
                f"{saved.data_shards} shards; a different count would change which examples "
                f"it sees. Drop the binding (or set it to {saved.data_shards}).")
        data_shards = saved.data_shards
    data_shards = process_count if data_shards is None else int(data_shards)
    if data_shards < 1 or batch_size % data_shards:
        raise ConfigError(f"train.data_shards={data_shards} must be >= 1 and divide "
                          f"train.batch_size={batch_size} (each shard fills an equal block of "
                          "rows of every batch).")
    if data_shards % process_count:
        raise ConfigError(
            f"This run reads its data in {data_shards} shards, which {process_count} processes "
            f"cannot split evenly. Run on a number of hosts that divides {data_shards}"
            + (" (the count is fixed when a run starts: set train.data_shards to a multiple of "
               "every host count you may use)." if saved is not None else
               ", or set train.data_shards to a multiple of the process count."))
    return data_shards


def shards_of_process(data_shards: int, process_index: int, process_count: int) -> range:
    """The data shards whose rows this process feeds (a contiguous block: the process's rows
    of the global batch are a contiguous block too)."""
    per_process = data_shards // process_count
    return range(process_index * per_process, (process_index + 1) * per_process)


def _concat_rows(*parts: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    return {k: tf.concat([p[k] for p in parts], axis=0) for k in parts[0]}


def host_dataset(order: DataOrder, feature_lengths: Mapping[str, int], *, start_batch: int = 0,
                 pack: bool = True, model=None, process_index: int | None = None,
                 process_count: int | None = None) -> tf.data.Dataset:
    """This process's rows of global batches start_batch, start_batch + 1, ... (endless)."""
    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
    rows_per_shard = order.batch_size // order.data_shards
    shards = [
        input_pipeline.get_dataset(
            order.task, feature_lengths, rows_per_shard, "train", shuffle=True, seed=order.seed,
            num_epochs=None, pack=pack, model=model,
            shard_info=seqio.ShardInfo(index=j, num_shards=order.data_shards))
        for j in shards_of_process(order.data_shards, process_index, process_count)]
    ds = shards[0] if len(shards) == 1 else tf.data.Dataset.zip(tuple(shards)).map(_concat_rows)
    return ds.skip(start_batch) if start_batch else ds


def host_batches(order: DataOrder, feature_lengths: Mapping[str, int], *,
                 start_batch: int = 0, pack: bool = True,
                 model=None) -> Iterator[dict[str, np.ndarray]]:
    """Numpy batches of `host_dataset` for the training loop."""
    return host_dataset(order, feature_lengths, start_batch=start_batch, pack=pack,
                        model=model).as_numpy_iterator()
