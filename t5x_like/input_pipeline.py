"""From a seqio task name to batches of model features, with early, readable errors.

seqio does the work (source, preprocessors, tokenization, packing through its feature
converter); this module checks the request before anything expensive starts and hands the
training loop numpy batches of exactly the features the model reads.
"""

from __future__ import annotations

import difflib
import os
from typing import Mapping

import jax
import seqio
import tensorflow as tf

from t5x_like.config import ConfigError

MODEL_FEATURES = ("encoder_input_tokens", "encoder_segment_ids", "decoder_input_tokens",
                  "decoder_target_tokens", "decoder_loss_weights", "decoder_segment_ids")


def resolve_task(name: str) -> seqio.Task | seqio.Mixture:
    """The registered task or mixture, or an error that suggests close names."""
    import tasks  # noqa: F401  (registers everything)

    names = list(seqio.TaskRegistry.names()) + list(seqio.MixtureRegistry.names())
    if name not in names:
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ConfigError(f"Unknown task or mixture {name!r}.{hint} Registered: "
                         f"{', '.join(sorted(names))}.")
    return seqio.get_mixture_or_task(name)


def _tasks_of(task_or_mixture: seqio.Task | seqio.Mixture) -> list[seqio.Task]:
    if isinstance(task_or_mixture, seqio.Mixture):
        return list(task_or_mixture.tasks)
    return [task_or_mixture]


def check_data_available(task_or_mixture: seqio.Task | seqio.Mixture, split: str) -> None:
    """Fail now, with instructions, if a TFDS dataset the task reads is not prepared."""
    for task in _tasks_of(task_or_mixture):
        source = task.source
        source = getattr(source, "source", source)  # a LazySource decides now
        if isinstance(source, seqio.FileDataSource) and split in source.splits:
            if not source.list_shards(split):
                raise ConfigError(
                    f"Task {task.name!r} reads files {source._split_to_filepattern[split]!r} "
                    f"for split {split!r}, and none exist. Check the path (c4_files.json_dir "
                    "or text_corpus.*_files).")
            continue
        if not isinstance(source, seqio.TfdsDataSource):
            continue
        loader = source.tfds_dataset
        try:
            tfds_split = loader._map_split(split)  # seqio's task split -> TFDS split mapping
        except KeyError:
            raise ConfigError(f"Task {task.name!r} has no split {split!r}; it has "
                              f"{list(loader.tfds_splits or {})}.") from None
        data_dir = loader.data_dir or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets"
        try:
            builder = loader.builder
            prepared = tf.io.gfile.exists(os.path.join(builder.data_dir, "dataset_info.json"))
            has_split = prepared and tfds_split in builder.info.splits
        except Exception:  # noqa: BLE001 - any failure here means "not usable as is"
            prepared = has_split = False
        if not prepared:
            dataset = loader.name.split(":")[0]
            how = (" (C4 needs Apache Beam and the Common Crawl dumps; prepare it once on a "
                   "cluster, or read downloaded json.gz shards with c4_files.json_dir)"
                   if dataset.startswith("c4") else "")
            raise ConfigError(
                f"Task {task.name!r} reads TFDS dataset {loader.name!r}, which is not prepared "
                f"in {data_dir}. Build it with `tfds build {dataset} --data_dir=DIR`{how} and "
                "pass --gin.TFDS_DATA_DIR=DIR, or train on the offline corpus: "
                "--gin.TASK=offline_span_corruption.")
        if not has_split:
            raise ConfigError(f"TFDS dataset {loader.name!r} has no split {tfds_split!r}; it has "
                             f"{sorted(builder.info.splits)}.")


def check_vocabulary(task_or_mixture: seqio.Task | seqio.Mixture, model_vocab_size: int) -> None:
    for task in _tasks_of(task_or_mixture):
        for key, feature in task.output_features.items():
            if feature.vocabulary.vocab_size > model_vocab_size:
                raise ConfigError(
                    f"Task {task.name!r} feature {key!r} uses a vocabulary of "
                    f"{feature.vocabulary.vocab_size} ids but the model has only "
                    f"{model_vocab_size}; set T5Config.vocab_size >= "
                    f"{feature.vocabulary.vocab_size} (T5 pads 32100 to 32128).")


def get_dataset(task_name: str, task_feature_lengths: Mapping[str, int], batch_size: int,
                split: str, shuffle: bool, seed: int | None, num_epochs: int | None,
                pack: bool = True) -> tf.data.Dataset:
    """Batches of this process's share of the global batch, with the model's features only."""
    resolve_task(task_name)
    process_count = jax.process_count()
    if batch_size % process_count:
        raise ConfigError(f"batch_size={batch_size} is not divisible by the {process_count} "
                         "processes.")
    ds = seqio.get_dataset(
        task_name, task_feature_lengths=dict(task_feature_lengths),
        feature_converter=seqio.EncDecFeatureConverter(pack=pack), dataset_split=split,
        shuffle=shuffle, num_epochs=num_epochs, seed=seed,
        shard_info=seqio.ShardInfo(jax.process_index(), process_count),
        batch_size=batch_size // process_count)
    return ds.map(lambda ex: {k: ex[k] for k in MODEL_FEATURES if k in ex},
                  num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
