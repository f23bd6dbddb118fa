"""Reading TensorFlow 1 checkpoints (`name.index` + `name.data-*`): Google's BERT release and
Mesh-TensorFlow's T5 checkpoints are in this format.

TensorFlow's own checkpoint reader does the reading, so a local path and a
`gs://` one go through the same file system layer as the rest of our storage. Variables that
only an optimizer needs (Adam's moments, Adafactor's slots, the step counter) are left
unread: a pretraining run's checkpoint is three times the size of its weights.
"""

from __future__ import annotations

import os
from typing import Callable

import numpy as np

from t5x_like import logs, storage
from t5x_like.errors import CheckpointError

Tensor = np.ndarray


def checkpoint_prefix(path: str, preferred: tuple[str, ...] = ()) -> str:
    """The checkpoint prefix `path` names: the prefix itself (`.../bert_model.ckpt`), or in a
    directory the newest one its `checkpoint` file records, else the one of `preferred` that
    is there, else its only `*.index` file."""
    if storage.exists(path + ".index"):
        return path
    if not storage.isdir(path):
        raise CheckpointError(
            f"{path} is neither a TensorFlow checkpoint (no {os.path.basename(path)}.index) "
            "nor a directory holding one."
        )
    tf = storage.tensorflow()
    latest = tf.train.latest_checkpoint(path)
    if latest and storage.exists(latest + ".index"):
        return latest
    for name in preferred:
        if storage.exists(os.path.join(path, name + ".index")):
            return os.path.join(path, name)
    indexes = sorted(n for n in storage.listdir(path) if n.endswith(".index"))
    if len(indexes) == 1:
        return os.path.join(path, indexes[0][: -len(".index")])
    if not indexes:
        raise CheckpointError(
            f"No TensorFlow checkpoint in {path}: it holds no *.index file. The download may "
            "be incomplete (a checkpoint is NAME.index plus NAME.data-*-of-*): fetch it again."
        )
    raise CheckpointError(
        f"{path} holds {len(indexes)} checkpoints ({', '.join(indexes[:4])}) and no "
        "`checkpoint` file says which is newest: give the prefix, e.g. "
        f"{os.path.join(path, indexes[-1][: -len('.index')])}."
    )


def _is_float(value: np.ndarray) -> bool:
    return np.issubdtype(value.dtype, np.floating) or value.dtype.name == "bfloat16"


def variable_names(prefix: str) -> set[str]:
    """The names of the checkpoint's variables (its index only is read)."""
    reader = storage.tensorflow().compat.v1.train.NewCheckpointReader(prefix)
    return set(reader.get_variable_to_shape_map())


def read_variables(prefix: str, skip: Callable[[str], bool]) -> dict[str, Tensor]:
    """Every variable of the checkpoint at `prefix` except those `skip` names, as numpy arrays
    (floating ones, bfloat16 included, as float32). An unreadable or truncated checkpoint is a
    CheckpointError naming it, raised before anything is written."""
    tf = storage.tensorflow()
    try:
        # The reader of the prefix itself: `tf.train.load_checkpoint` first asks whether the
        # path is a directory, which a bucket's flat names can answer yes to.
        reader = tf.compat.v1.train.NewCheckpointReader(prefix)
        shapes = reader.get_variable_to_shape_map()
    except Exception as e:  # noqa: BLE001 - tf.errors.*: damaged index or missing data file
        raise CheckpointError(
            f"{prefix} is not a readable TensorFlow checkpoint "
            f"({str(e).splitlines()[0][:200]}); it may be truncated: fetch it again."
        ) from None
    names = sorted(n for n in shapes if not skip(n))
    total = sum(int(np.prod(shapes[n])) for n in names)
    variables: dict[str, Tensor] = {}
    with logs.progress(desc="convert read", total=total, unit=" values", unit_scale=True) as bar:
        for name in names:
            try:
                value = np.asarray(reader.get_tensor(name))
                # Mesh-TF keeps bfloat16 masters; every other path holds float32 parameters.
                variables[name] = value.astype(np.float32) if _is_float(value) else value
            except Exception as e:  # noqa: BLE001 - a data shard shorter than its index says
                raise CheckpointError(
                    f"{prefix}: variable {name} cannot be read ({str(e).splitlines()[0][:200]}); "
                    "the checkpoint's data file may be truncated: fetch it again."
                ) from None
            bar.update(variables[name].size)
    return variables
