"""From a seqio task name to batches of model features, with early, readable errors.

seqio does the work (source, preprocessors, tokenization, packing through its feature
converter); this module checks the request before anything expensive starts and hands the
training loop numpy batches of exactly the features the model reads.
"""

from __future__ import annotations

import difflib
import hashlib
import os
from typing import TYPE_CHECKING, Mapping, TypeAlias, TypeVar

import jax
import seqio
import tensorflow as tf

from t5x_like import storage
from t5x_like.data import task_heads, text_files
from t5x_like.errors import ConfigError

if TYPE_CHECKING:
    from t5x_like.models.base import Model


# A task or mixture, or the name it is registered under. A run resolves its task once
# (`resolve_task`) and hands the object on; the functions here and in `evaluation` and
# `train_data` take either, so a name is looked up only where a caller has nothing else.
TaskLike: TypeAlias = str | seqio.Task | seqio.Mixture
B = TypeVar("B")  # a batch, whatever its type


def resolve_task(name: TaskLike) -> seqio.Task | seqio.Mixture:
    """The registered task or mixture, or an error that suggests close names (an object
    passes through).

    The library registers no task itself: the entry points import the task modules
    (`gin_setup.register_configurables` imports `tasks`), and a script calling the library
    directly imports the module that registers its tasks first."""
    if not isinstance(name, str):
        return name
    names = list(seqio.TaskRegistry.names()) + list(seqio.MixtureRegistry.names())
    if name not in names:
        if not names:
            raise ConfigError(
                f"Unknown task or mixture {name!r}: no task is registered. Import "
                "the module that registers it first (`import t5x_like.tasks` for this "
                "repository's tasks), or run through python -m t5x_like.train, "
                "which does."
            )
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ConfigError(
            f"Unknown task or mixture {name!r}.{hint} Registered: {', '.join(sorted(names))}."
        )
    return seqio.get_mixture_or_task(name)


def _tasks_of(
    task_or_mixture: seqio.Task | seqio.Mixture, split: str | None = None
) -> list[seqio.Task]:
    """The task, or the mixture's tasks; with `split`, only the members that have it, as
    seqio's `Mixture.get_dataset` reads only those (the T5 library's GLUE and SuperGLUE
    mixtures hold evaluation-only members without a `train` split, and DPR has no
    `validation`). A member whose splits are unknown yet (its TFDS dataset is not prepared)
    stays, so the check below says how to prepare it."""
    if not isinstance(task_or_mixture, seqio.Mixture):
        return [task_or_mixture]
    return [t for t in task_or_mixture.tasks if split is None or _may_have(t, split)]


def _may_have(task: seqio.Task, split: str) -> bool:
    try:
        return split in task.splits
    except Exception:  # noqa: BLE001 - seqio raises when a TFDS dataset's splits are unknown
        return True


def check_data_available(task_or_mixture: seqio.Task | seqio.Mixture, split: str) -> None:
    """Fail now, with instructions, if a TFDS dataset the task reads is not prepared."""
    members = _tasks_of(task_or_mixture, split)
    if not members:
        raise ConfigError(f"No task of mixture {task_or_mixture.name!r} has a {split!r} split.")
    for task in members:
        source = task.source
        source = getattr(source, "source", source)  # a LazySource decides now
        if isinstance(source, seqio.FileDataSource) and split not in source.splits:
            raise ConfigError(
                f"Task {task.name!r} has no files for split {split!r} (it reads "
                f"{dict(source._split_to_filepattern)}). Bind the split's files "
                f"(e.g. text_corpus.{split}_files=...) or use another split."
            )
        if isinstance(source, seqio.FileDataSource):
            if not source.list_shards(split):
                raise ConfigError(
                    f"Task {task.name!r} reads files {source._split_to_filepattern[split]!r} "
                    f"for split {split!r}, and none exist. Check the path (c4_files.json_dir "
                    "or text_corpus.*_files)."
                )
            if isinstance(source, (text_files.TextFileDataSource, text_files.JsonlDataSource)):
                text_files.check_text_files(source.list_shards(split))
            continue
        if not isinstance(source, seqio.TfdsDataSource):
            continue
        loader = source.tfds_dataset
        try:
            tfds_split = loader._map_split(split)  # seqio's task split -> TFDS split mapping
        except KeyError:
            raise ConfigError(
                f"Task {task.name!r} has no split {split!r}; it has "
                f"{list(loader.tfds_splits or {})}."
            ) from None
        data_dir = loader.data_dir or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets"
        try:
            builder = loader.builder
            prepared = tf.io.gfile.exists(os.path.join(builder.data_dir, "dataset_info.json"))
            has_split = prepared and tfds_split in builder.info.splits
        except Exception:  # noqa: BLE001 - any failure here means "not usable as is"
            prepared = has_split = False
        if not prepared:
            dataset = loader.name.split(":")[0]
            how = (
                " (C4 needs Apache Beam and the Common Crawl dumps; prepare it once on a "
                "cluster, or read downloaded json.gz shards with c4_files.json_dir)"
                if dataset.startswith("c4")
                else ""
            )
            offline = (
                ", or train on the offline corpus: --gin.TASK=offline_span_corruption"
                if split == "train"
                else ""
            )
            raise ConfigError(
                f"Task {task.name!r} reads TFDS dataset {loader.name!r}, which is not prepared "
                f"in {data_dir}. Build it with `tfds build {dataset} --data_dir=DIR`{how} and "
                f"pass --gin.TFDS_DATA_DIR=DIR{offline}."
            )
        if not has_split:
            raise ConfigError(
                f"TFDS dataset {loader.name!r} has no split {tfds_split!r}; it has "
                f"{sorted(builder.info.splits)}."
            )


def check_vocabulary(task_or_mixture: seqio.Task | seqio.Mixture, model_vocab_size: int) -> None:
    """The task's ids must fit the model's embedding. A WordPiece vocab.txt must match it
    exactly: its line numbers are the ids, so another file of any size means other words."""
    from t5x_like.data.wordpiece import WordPieceVocabulary

    for task in _tasks_of(task_or_mixture):
        for key, feature in task.output_features.items():
            vocab = feature.vocabulary
            if isinstance(vocab, WordPieceVocabulary) and vocab.vocab_size != model_vocab_size:
                raise ConfigError(
                    f"Task {task.name!r} reads the WordPiece vocabulary {vocab.vocab_path} "
                    f"({vocab.vocab_size} pieces) but the model has {model_vocab_size} token "
                    "embeddings. Use the checkpoint's own vocab.txt "
                    "(--gin.bert_vocab_path.path=DIR/vocab.txt) or a model gin file with "
                    f"BertConfig.vocab_size = {vocab.vocab_size}."
                )
            if feature.vocabulary.vocab_size > model_vocab_size:
                raise ConfigError(
                    f"Task {task.name!r} feature {key!r} uses a vocabulary of "
                    f"{feature.vocabulary.vocab_size} ids but the model has only "
                    f"{model_vocab_size}; set T5Config.vocab_size >= "
                    f"{feature.vocabulary.vocab_size} (T5 pads 32100 to 32128)."
                )


def vocabulary_identity(vocabulary: seqio.Vocabulary) -> dict:
    """What the ids mean, as a fingerprint a checkpoint can keep: two vocabularies of the same
    size but another tokenizer give other words the same ids. `file` says where it came from
    (for messages); the other fields decide equality (`same_vocabulary`)."""
    from t5x_like.data.wordpiece import WordPieceVocabulary

    if isinstance(vocabulary, seqio.SentencePieceVocabulary):
        return {
            "kind": "SentencePiece",
            "sha256": hashlib.sha256(vocabulary.sp_model).hexdigest(),
            "extra_ids": vocabulary.extra_ids,
            "file": str(vocabulary.sentencepiece_model_file),
        }
    if isinstance(vocabulary, WordPieceVocabulary):
        with open(vocabulary.vocab_path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        return {
            "kind": "WordPiece",
            "sha256": digest,
            "lower_case": vocabulary.lower_case,
            "file": vocabulary.vocab_path,
        }
    from t5x_like.data.bpe import BPEVocabulary

    if isinstance(vocabulary, BPEVocabulary):
        files = hashlib.sha256()
        for path in (vocabulary.vocab_path, vocabulary.merges_path):
            files.update(storage.read_bytes(path))
        return {
            "kind": f"BPE ({vocabulary.kind})",
            "sha256": files.hexdigest(),
            "extra_ids": vocabulary.extra_ids,
            "file": vocabulary.vocab_path,
        }
    pieces = "\n".join(vocabulary.decode([i]) for i in range(vocabulary.vocab_size))
    return {
        "kind": type(vocabulary).__name__,
        "sha256": hashlib.sha256(pieces.encode("utf-8")).hexdigest(),
        "file": "",
    }


def task_vocabularies(task_or_mixture: seqio.Task | seqio.Mixture) -> dict[str, dict]:
    """{feature: vocabulary_identity} of the task (a mixture's first member with each
    feature)."""
    found: dict[str, dict] = {}
    for task in _tasks_of(task_or_mixture):
        for key, feature in task.output_features.items():
            if key not in found:
                found[key] = vocabulary_identity(feature.vocabulary)
    return found


def same_vocabulary(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if k != "file"} == {
        k: v for k, v in b.items() if k != "file"
    }


def _vocabulary_name(v: Mapping) -> str:
    return f"{v['kind']} {v.get('file') or '(built in)'} (sha256 {v['sha256'][:12]})"


# The identities of vocabularies that turn text into ids (not a label's pass-through ids).
_TEXT_VOCABULARIES = ("SentencePiece", "WordPiece", "BPE")


def check_checkpoint_vocabulary(task_or_mixture: seqio.Task | seqio.Mixture, path: str) -> None:
    """A task must read the vocabulary that the checkpoint at `path` came with (the tokenizer
    `convert` kept beside it): a different one, of any size, gives the same ids other
    meanings. Refused naming both, before any parameter is read; a checkpoint saved without
    its tokenizer is not checked."""
    from t5x_like.checkpoints import tokenizer_files

    directory = tokenizer_files.find(path)
    vocabulary = tokenizer_files.vocabulary(directory) if directory else None
    if vocabulary is None:
        return
    theirs = vocabulary_identity(vocabulary)
    for task in _tasks_of(task_or_mixture):
        for key, feature in task.output_features.items():
            ours = vocabulary_identity(feature.vocabulary)
            if ours["kind"].startswith(_TEXT_VOCABULARIES) and not same_vocabulary(theirs, ours):
                raise ConfigError(
                    f"Task {task.name!r} feature {key!r} reads the vocabulary "
                    f"{_vocabulary_name(ours)}, but the checkpoint {path} came with "
                    f"{_vocabulary_name(theirs)}: the same ids would mean other pieces. Use a "
                    "task on the checkpoint's tokenizer (its files are in "
                    f"{os.path.join(str(directory), tokenizer_files.DIRECTORY)}), or another "
                    "checkpoint."
                )


def check_resumed_vocabulary(
    saved: Mapping[str, dict], current: Mapping[str, dict], model_dir: str, task_name: str
) -> None:
    """A resumed run must read the vocabulary its checkpoint was trained with."""
    for key, before in saved.items():
        now = current.get(key)
        if now is not None and not same_vocabulary(before, now):
            name = _vocabulary_name

            raise ConfigError(
                f"MODEL_DIR {model_dir} was trained with the {key!r} vocabulary {name(before)}, "
                f"but task {task_name!r} reads {name(now)}: the same ids would mean other "
                "pieces. Resume with the checkpoint's vocabulary, or start a new MODEL_DIR "
                "(--gin.Checkpointing.init_checkpoint to start from its parameters)."
            )


def check_num_labels(task_or_mixture: seqio.Task | seqio.Mixture, model: Model) -> None:
    """Each task's head (`data.task_heads`: label count, GPT-1's way of combining sequences)
    must be one the model can train (`Model.check_task_head`)."""
    for task in _tasks_of(task_or_mixture):
        head = task_heads.head_of(task.name)
        if head is not None:
            model.check_task_head(task.name, head)


def check_sequence_fits(
    model,
    task_feature_lengths: Mapping[str, int],
    pack: bool,
    binding: str = "Data.task_feature_lengths",
) -> None:
    """The model's sequences must fit its learned position table (BERT, GPT): otherwise the
    first step would fail inside the compiled model, after minutes of set-up."""
    cfg = model.config
    limit = cfg.position_limit
    if limit is None:
        return  # relative positions (T5) or none: any length is representable
    lengths = model.feature_converter(pack).get_model_feature_lengths(dict(task_feature_lengths))
    longest = max(
        lengths.get(k, 0) for k in ("input_ids", "decoder_input_tokens", "decoder_target_tokens")
    )
    if longest > limit:
        raise ConfigError(
            f"{binding}={dict(task_feature_lengths)} makes sequences of {longest} tokens, but "
            f"the model has {limit} learned positions ({type(cfg).__name__}."
            f"max_position_embeddings). Shorten the feature lengths, or use a model with "
            f"max_position_embeddings >= {longest}."
        )


def check_not_empty(
    first_batch: B | None, task_name: str, split: str, task_feature_lengths: Mapping[str, int]
) -> B:
    """`first_batch` itself; it is None when the pipeline gave nothing: say why it may be,
    now."""
    if first_batch is None:
        raise ConfigError(
            f"Task {task_name!r} gives no {split!r} examples at {dict(task_feature_lengths)}: "
            "the source is empty or the task's preprocessors filtered every example out "
            "(e.g. all texts too short, or every line blank). Check the data files and the "
            "task's filters."
        )
    return first_batch


def steps_for_epochs(
    task_or_mixture: seqio.Task | seqio.Mixture, epochs: float, batch_size: int
) -> int:
    """Training steps for `epochs` passes over the train split (the reference's
    int(num_examples / batch_size * epochs)), from the dataset's own example count (of a
    mixture's members that are trained on: a `train` split and a rate above 0)."""
    total = 0
    for task in _tasks_of(task_or_mixture, "train"):
        if isinstance(task_or_mixture, seqio.Mixture) and not task_or_mixture.get_rate(task):
            continue
        try:
            count = task.source.num_input_examples("train")
        except Exception as e:  # noqa: BLE001 - sources that cannot count say so differently
            count, why = None, f" ({e})"
        else:
            why = ""
        if not count:
            raise ConfigError(
                f"Task {task.name!r} cannot count its training examples{why}; "
                "set Schedule.train_steps instead, with Schedule.train_epochs=None."
            )
        total += count
    return max(1, int(total / batch_size * epochs))


def get_dataset(
    task: TaskLike,
    task_feature_lengths: Mapping[str, int],
    batch_size: int,
    split: str,
    shuffle: bool,
    seed: int | None,
    num_epochs: int | None,
    pack: bool = True,
    *,
    model: Model,
    shard_info: seqio.ShardInfo | None = None,
) -> tf.data.Dataset:
    """Batches of this process's share of the global batch, built by the model's feature
    converter and holding the features it reads (`Model.FEATURES`) only. With
    `shard_info`, batches of `batch_size` rows of that shard of the data instead (the
    training stream's data shards, `t5x_like.train_data`)."""
    provider = resolve_task(task)
    if shard_info is None:
        process_count = jax.process_count()
        if batch_size % process_count:
            raise ConfigError(
                f"batch_size={batch_size} is not divisible by the {process_count} processes."
            )
        shard_info = seqio.ShardInfo(jax.process_index(), process_count)
        batch_size //= process_count
    ds = seqio.get_dataset(
        provider,
        task_feature_lengths=dict(task_feature_lengths),
        feature_converter=model.feature_converter(pack),
        dataset_split=split,
        shuffle=shuffle,
        num_epochs=num_epochs,
        seed=seed,
        shard_info=shard_info,
        batch_size=batch_size,
    )
    features = model.FEATURES
    return ds.map(
        lambda ex: {k: ex[k] for k in features if k in ex}, num_parallel_calls=tf.data.AUTOTUNE
    ).prefetch(tf.data.AUTOTUNE)
