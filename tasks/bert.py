"""BERT's tasks (Devlin et al., 2018, sections 3.1-3.2 and 4): pretraining pairs and the
paper's fine-tuning benchmarks, in BERT's input format (WordPiece, [CLS]/[SEP], segment ids,
numeric labels; not text-to-text).

Pretraining (task feature lengths {"inputs": 128, "targets": 20}, then 512/80):
  bert_offline_pretraining[_wwm]      the offline corpus (no download)
  bert_c4_pretraining[_wwm]           C4 (TFDS c4/en, or c4_files.json_dir shards)
  bert_text_corpus_pretraining[_wwm]  your own text files (text_corpus.train_files=...)
  bert_sentence_corpus_pretraining[_wwm]
                                      the reference's corpus format: .txt files with one
                                      sentence per line and a blank line between documents
                                      (bert_sentence_corpus.train_files=...)
  bert_tfrecord_pretraining           TFRecords written by the reference's
                                      create_pretraining_data.py, as they are
                                      (bert_tfrecords.train_files=...)
The pairs' options (documents per group, static masking with `dupe_factor`) are
`bert_pretraining_options` in gin.
Fine-tuning (task feature lengths {"inputs": 128} or as the recipe says):
  bert_glue_{cola,sst2,mrpc,qqp,stsb,mnli,qnli,rte,wnli}, bert_glue_mnli_{matched,mismatched}
  bert_squad_v110, bert_squad_v200     SQuAD spans (document stride 128)
  bert_hellaswag                       SWAG-style multiple choice (4 endings)
  bert_conll2003_ner                   CoNLL-2003 NER (9 IOB tags)
  bert_offline_word_order              offline sentence classification: are the words in
                                       their original order (1) or shuffled (0)?

The vocabulary is one `vocab.txt` for all of them: `bert_vocab_path.path` in gin (or the
BERT_VOCAB environment variable), with `bert_vocab_lower_case.lower_case = False` for a cased
one. Unset, it is the vocab.txt (and casing) `convert` kept with the checkpoint being
fine-tuned or evaluated, and without one a WordPiece vocabulary learnt once from the offline
corpus. Each fine-tuning task records how many
outputs its head needs in `t5x_like.data.task_heads`; training checks the model against it.
"""

from __future__ import annotations

import os
from typing import Callable, Mapping, Sequence

import gin
import numpy as np
import seqio
import tensorflow as tf

from t5x_like import metrics, offline_corpus
from t5x_like.checkpoints import tokenizer_files
from t5x_like.data import task_heads, text_files
from t5x_like.data.wordpiece import WordPieceVocabulary
from t5x_like.errors import ConfigError
from t5x_like.families.bert import preprocessors as bp

from . import c4, offline


def _kept_vocab_file() -> str | None:
    """The vocab.txt kept with the checkpoint being fine-tuned or evaluated, if any."""
    kept = tokenizer_files.offered("wordpiece")
    return os.path.join(kept["directory"], kept["file"]) if kept else None


@gin.configurable
def bert_vocab_path(path: str | None = None) -> str:
    """The WordPiece vocab.txt of every BERT task (read when a dataset is first built): the
    bound path, else BERT_VOCAB, else the one kept with the checkpoint (`tokenizer_files.
    offer_to_tasks`), else one learnt from the offline corpus."""
    return (
        path
        or os.environ.get("BERT_VOCAB")
        or _kept_vocab_file()
        or offline_corpus.ensure_wordpiece_vocabulary()
    )


@gin.configurable
def bert_vocab_lower_case(lower_case: bool | None = None) -> bool:
    """False for a cased checkpoint (e.g. BERT-Base-Cased, the paper's choice for NER).
    Unbound: the kept tokenizer's casing when its vocab.txt is the one read, else True."""
    if lower_case is not None:
        return lower_case
    kept = tokenizer_files.offered("wordpiece")
    if kept is not None and bert_vocab_path() == _kept_vocab_file():
        return bool(kept["lower_case"])
    return True


BERT_VOCABULARY = WordPieceVocabulary(bert_vocab_path, bert_vocab_lower_case)


def _features(*keys: str, rank: int = 1) -> dict[str, seqio.Feature]:
    return {k: seqio.Feature(BERT_VOCABULARY, add_eos=False, rank=rank) for k in keys}


def _register(
    name: str,
    source: seqio.DataSource,
    preprocessors: Sequence[Callable],
    metric_fns: Sequence[Callable] = (),
    num_labels: int | None = None,
    output_keys: Sequence[str] = ("inputs",),
    rank: int = 1,
) -> seqio.Task:
    if num_labels is not None:
        task_heads.register(name, num_labels)
    return seqio.TaskRegistry.add(
        name,
        source=source,
        preprocessors=list(preprocessors),
        output_features=_features(*output_keys, rank=rank),
        metric_fns=list(metric_fns),
    )


# ------------------------------------------------------------------------------ pretraining
@gin.configurable
def bert_pretraining_options(
    documents_per_group: int | str | None = None,
    dupe_factor: int | None = None,
    random_seed: int = bp.REFERENCE_RANDOM_SEED,
    skip_single_sentence_chunks: bool = False,
) -> dict:
    """Options of every bert_*_pretraining task's pairs (`bert_preprocessors.pretraining_pairs`),
    read when a dataset is built. `documents_per_group` (where a NotNext B may come from):
    None is the task's default: the whole corpus for the offline corpus and for files in the
    reference's format (bert_sentence_corpus_*), as create_pretraining_data.py draws from every
    document of its input; `bert_preprocessors.DOCUMENTS_PER_GROUP` for C4 and text corpora,
    which may not fit in memory. 'all' makes any task's group its whole training corpus
    (counted once when the dataset is built; held in memory while its pairs are made); a
    number, that many documents (for a corpus of fewer, its number of documents: seqio repeats
    the source before the pairs are made, so a larger group would hold several copies of the
    corpus). `dupe_factor`: None masks afresh each epoch; 10 is the reference's static
    masking."""
    return {
        "documents_per_group": documents_per_group,
        "dupe_factor": dupe_factor,
        "random_seed": random_seed,
        "skip_single_sentence_chunks": skip_single_sentence_chunks,
    }


def _pretraining(
    source: seqio.DataSource, default_group: Callable[[], int | str], whole_word: bool
) -> Callable:
    def pretraining_pairs(ds: tf.data.Dataset, sequence_length: Mapping[str, int]):
        options = bert_pretraining_options()
        group = options.pop("documents_per_group") or default_group()
        if group == "all":
            group = corpus_documents(source)
        if not isinstance(group, int) or group < 1:
            raise ConfigError(
                f"bert_pretraining_options.documents_per_group={group!r}: give "
                "a number of documents, or 'all' for the whole corpus."
            )
        return bp.pretraining_pairs(
            BERT_VOCABULARY, group, whole_word_masking=whole_word, **options
        )(ds, sequence_length)

    return pretraining_pairs


def corpus_documents(source: seqio.DataSource) -> int:
    """The training split's number of documents: the source's own count where it keeps one
    (TFDS), else counted by reading the split once."""
    count = source.num_input_examples("train")
    if count:
        return int(count)
    ds = source.get_dataset("train", shuffle=False)
    return int(ds.reduce(np.int64(0), lambda n, _: n + 1))


def offline_documents() -> int:
    """The offline corpus' training documents: its group holds all of them, so a NotNext B
    comes from anywhere in the corpus, as in the reference."""
    with open(offline_corpus.ensure_corpus()["train"], encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def read_sentence_per_line(path: tf.Tensor) -> tf.data.Dataset:
    """The reference's corpus format (create_pretraining_data.py's input): one sentence per
    line, a blank (or blank-looking) line between documents; the file's end ends a document.
    Each document is `{"sentences": its lines, "text": them joined by newlines}`."""
    compression = tf.where(tf.strings.regex_full_match(path, r".*\.gz"), "GZIP", "")
    lines = tf.data.TextLineDataset(path, compression_type=compression)
    lines = lines.concatenate(tf.data.Dataset.from_tensors(tf.constant("")))

    def step(sentences, line):
        line = tf.strings.strip(line)
        ends = tf.equal(line, "")
        done = tf.logical_and(ends, tf.size(sentences) > 0)
        following = tf.cond(
            ends,
            lambda: tf.zeros([0], tf.string),
            lambda: tf.concat([sentences, tf.reshape(line, [1])], 0),
        )
        emitted = tf.cond(done, lambda: sentences, lambda: tf.zeros([0], tf.string))
        return following, (emitted, done)

    documents = lines.scan(tf.zeros([0], tf.string), step)
    documents = documents.filter(lambda sentences, done: done)
    return documents.map(
        lambda sentences, done: {
            "sentences": sentences,
            "text": tf.strings.reduce_join(sentences, separator="\n"),
        }
    )


class _BoundFiles:
    """A file source over the files bound in gin (`binding`): asking for a split with none
    bound is an error that names the binding (never the training files in disguise)."""

    binding = ""

    def list_shards(self, split: str) -> Sequence[str]:
        if split not in self._split_to_filepattern:
            raise ConfigError(
                f"No {split} files for {self.binding}: bind "
                f"{self.binding}.{split}_files='/path/*' in gin."
            )
        return super().list_shards(split)


class SentencePerLineSource(_BoundFiles, seqio.FileDataSource):
    """Text files in the reference's corpus format (`read_sentence_per_line`)."""

    binding = "bert_sentence_corpus"

    def __init__(self, split_to_filepattern: Mapping[str, str | Sequence[str]]):
        super().__init__(read_sentence_per_line, split_to_filepattern)


class ReferenceRecordSource(_BoundFiles, seqio.TFExampleDataSource):
    """TFRecords written by the reference's create_pretraining_data.py (any lengths)."""

    binding = "bert_tfrecords"

    def __init__(self, split_to_filepattern: Mapping[str, str | Sequence[str]]):
        super().__init__(split_to_filepattern, bp.reference_record_features())


def _split_files(train_files, validation_files, binding: str) -> dict:
    if not train_files:
        raise ConfigError(
            f"Bind {binding}.train_files='/path/*' (and, to evaluate, "
            f"{binding}.validation_files=...) in gin."
        )
    splits = {"train": train_files}
    if validation_files:
        splits["validation"] = validation_files
    return splits


@gin.configurable("bert_sentence_corpus")
def sentence_corpus_source(
    train_files: str | Sequence[str] | None = None,
    validation_files: str | Sequence[str] | None = None,
) -> SentencePerLineSource:
    """Your corpus in the reference's format for the bert_sentence_corpus_* tasks."""
    return SentencePerLineSource(
        _split_files(train_files, validation_files, SentencePerLineSource.binding)
    )


@gin.configurable("bert_tfrecords")
def tfrecord_source(
    train_files: str | Sequence[str] | None = None,
    validation_files: str | Sequence[str] | None = None,
) -> ReferenceRecordSource:
    """TFRecords written by the reference's create_pretraining_data.py, for
    bert_tfrecord_pretraining."""
    return ReferenceRecordSource(
        _split_files(train_files, validation_files, ReferenceRecordSource.binding)
    )


def _streamed() -> int:
    return bp.DOCUMENTS_PER_GROUP


def _whole_corpus() -> str:
    return "all"


for _prefix, _source, _group in (
    ("offline", offline.OFFLINE_SOURCE, offline_documents),
    ("c4", text_files.LazySource(c4.c4_source), _streamed),
    ("text_corpus", text_files.LazySource(text_files.text_corpus_source), _streamed),
    ("sentence_corpus", text_files.LazySource(sentence_corpus_source), _whole_corpus),
):
    for _suffix, _wwm in (("", False), ("_wwm", True)):
        _register(
            f"bert_{_prefix}_pretraining{_suffix}",
            _source,
            [_pretraining(_source, _group, _wwm)],
            output_keys=("inputs", "targets"),
        )
_register(
    "bert_tfrecord_pretraining",
    text_files.LazySource(tfrecord_source),
    [bp.from_reference_records],
    output_keys=("inputs", "targets"),
)

# ------------------------------------------------------------------------------ GLUE
GLUE_VERSION = "2.*.*"
# text features, number of outputs (1 = regression) and metrics of each GLUE task
GLUE: dict[str, tuple[tuple[str, ...], int, list[Callable]]] = {
    "cola": (("sentence",), 2, [metrics.matthews_corrcoef]),
    "sst2": (("sentence",), 2, [metrics.accuracy]),
    "mrpc": (("sentence1", "sentence2"), 2, [metrics.f1_and_accuracy]),
    "qqp": (("question1", "question2"), 2, [metrics.f1_and_accuracy]),
    "stsb": (("sentence1", "sentence2"), 1, [metrics.pearson_and_spearman]),
    "mnli": (("premise", "hypothesis"), 3, [metrics.accuracy]),
    "qnli": (("question", "sentence"), 2, [metrics.accuracy]),
    "rte": (("sentence1", "sentence2"), 2, [metrics.accuracy]),
    "wnli": (("sentence1", "sentence2"), 2, [metrics.accuracy]),
}

for _b, (_keys, _labels, _metrics) in GLUE.items():
    _splits = None
    if _b == "mnli":
        _splits = ["train", "validation_matched", "validation_mismatched"]
    _register(
        f"bert_glue_{_b}",
        seqio.TfdsDataSource(f"glue/{_b}:{GLUE_VERSION}", splits=_splits),
        [bp.frame_pair(BERT_VOCABULARY, _keys)],
        _metrics,
        _labels,
    )
for _which in ("matched", "mismatched"):
    _register(
        f"bert_glue_mnli_{_which}",
        seqio.TfdsDataSource(
            f"glue/mnli:{GLUE_VERSION}", splits={"validation": f"validation_{_which}"}
        ),
        [bp.frame_pair(BERT_VOCABULARY, GLUE["mnli"][0])],
        [metrics.accuracy],
        3,
    )

# ------------------------------------------------------------------------------ SQuAD, SWAG, NER
for _version, _tfds in (("v110", "squad/v1.1:3.*.*"), ("v200", "squad/v2.0:3.*.*")):
    _register(
        f"bert_squad_{_version}",
        seqio.TfdsDataSource(_tfds),
        [bp.frame_squad(BERT_VOCABULARY)],
        [metrics.squad if _version == "v110" else metrics.squad_v2],
    )

_register(
    "bert_hellaswag",
    seqio.TfdsDataSource("hellaswag:1.*.*"),
    [bp.frame_choices(BERT_VOCABULARY, "context", "endings")],
    [metrics.accuracy],
    4,
    rank=2,
)  # (choices, length)

CONLL2003_TAGS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
_register(
    "bert_conll2003_ner",
    seqio.TfdsDataSource("conll2003:1.*.*"),
    [bp.frame_tagging(BERT_VOCABULARY)],
    [metrics.conll_ner_f1(CONLL2003_TAGS)],
    len(CONLL2003_TAGS),
)


# ------------------------------------------------------------------------------ offline
MIN_WORDS_FOR_ORDER = 6


def word_order_examples(ds: tf.data.Dataset) -> tf.data.Dataset:
    """Offline documents -> sentences of >= 6 words; by a hash of the sentence, half keep
    their words (label 1) and half have them shuffled (label 0). Deterministic, so train and
    validation are fixed sets."""
    sentences = ds.map(lambda ex: bp.split_sentences(ex["text"])).unbatch()
    sentences = sentences.filter(lambda s: tf.size(tf.strings.split(s)) >= MIN_WORDS_FOR_ORDER)

    def label(sentence):
        digest = tf.strings.to_hash_bucket_fast(sentence, 2**31 - 1)
        words = tf.strings.split(sentence)
        shuffled = tf.random.experimental.stateless_shuffle(
            words, seed=tf.stack([digest, tf.constant(0, tf.int64)])
        )
        keep = digest % 2 == 1
        text = tf.where(keep, sentence, tf.strings.reduce_join(shuffled, separator=" "))
        return {"sentence": text, "label": tf.cast(keep, tf.int32)}

    return sentences.map(label, num_parallel_calls=tf.data.AUTOTUNE)


_register(
    "bert_offline_word_order",
    offline.OFFLINE_SOURCE,
    [word_order_examples, bp.frame_pair(BERT_VOCABULARY, ("sentence",))],
    [metrics.accuracy],
    2,
)
