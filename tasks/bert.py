"""BERT's tasks (SPEC.md section 2): pretraining pairs and the paper's fine-tuning benchmarks,
in BERT's input format (WordPiece, [CLS]/[SEP], segment ids, numeric labels; not text-to-text).

Pretraining (task feature lengths {"inputs": 128, "targets": 20}, then 512/80):
  bert_offline_pretraining[_wwm]      the offline corpus (no download)
  bert_c4_pretraining[_wwm]           C4 (TFDS c4/en, or c4_files.json_dir shards)
  bert_text_corpus_pretraining        your own text files (text_corpus.train_files=...)
Fine-tuning (task feature lengths {"inputs": 128} or as the recipe says):
  bert_glue_{cola,sst2,mrpc,qqp,stsb,mnli,qnli,rte,wnli}, bert_glue_mnli_{matched,mismatched}
  bert_squad_v110, bert_squad_v200     SQuAD spans (document stride 128)
  bert_hellaswag                       SWAG-style multiple choice (4 endings)
  bert_conll2003_ner                   CoNLL-2003 NER (9 IOB tags)
  bert_offline_word_order              offline sentence classification: are the words in
                                       their original order (1) or shuffled (0)?

The vocabulary is one `vocab.txt` for all of them: `bert_vocab_path.path` in gin (or the
BERT_VOCAB environment variable): the checkpoint's own vocab.txt when fine-tuning an imported
model, with `bert_vocab_lower_case.lower_case = False` for a cased one. Unset, it is a WordPiece vocabulary learnt once from the offline corpus. `NUM_LABELS`
says how many outputs each fine-tuning task needs; training checks the model against it.
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

import gin
import seqio
import tensorflow as tf

from t5x_like import bert_preprocessors as bp
from t5x_like import metrics, offline_corpus
from t5x_like.data.wordpiece import WordPieceVocabulary
from tasks import c4, offline, text_files


@gin.configurable
def bert_vocab_path(path: str | None = None) -> str:
    """The WordPiece vocab.txt of every BERT task (read when a dataset is first built)."""
    return path or os.environ.get("BERT_VOCAB") or offline_corpus.ensure_wordpiece_vocabulary()


@gin.configurable
def bert_vocab_lower_case(lower_case: bool = True) -> bool:
    """False for a cased checkpoint (e.g. BERT-Base-Cased, the paper's choice for NER)."""
    return lower_case


BERT_VOCABULARY = WordPieceVocabulary(bert_vocab_path, bert_vocab_lower_case)


def _features(*keys: str, rank: int = 1) -> dict[str, seqio.Feature]:
    return {k: seqio.Feature(BERT_VOCABULARY, add_eos=False, rank=rank) for k in keys}


NUM_LABELS: dict[str, int] = {}


def _register(name: str, source: seqio.DataSource, preprocessors: Sequence[Callable],
              metric_fns: Sequence[Callable] = (), num_labels: int | None = None,
              output_keys: Sequence[str] = ("inputs",), rank: int = 1) -> seqio.Task:
    if num_labels is not None:
        NUM_LABELS[name] = num_labels
    return seqio.TaskRegistry.add(name, source=source, preprocessors=list(preprocessors),
                                  output_features=_features(*output_keys, rank=rank),
                                  metric_fns=list(metric_fns))


# ------------------------------------------------------------------------------ pretraining
for _prefix, _source in (("offline", offline.OFFLINE_SOURCE),
                         ("c4", text_files.LazySource(c4.c4_source)),
                         ("text_corpus", text_files.LazySource(text_files.text_corpus_source))):
    for _suffix, _wwm in (("", False), ("_wwm", True)):
        _register(f"bert_{_prefix}_pretraining{_suffix}", _source,
                  [bp.pretraining_pairs(BERT_VOCABULARY, whole_word_masking=_wwm)],
                  output_keys=("inputs", "targets"))

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
    _register(f"bert_glue_{_b}", seqio.TfdsDataSource(f"glue/{_b}:{GLUE_VERSION}", splits=_splits),
              [bp.frame_pair(BERT_VOCABULARY, _keys)], _metrics, _labels)
for _which in ("matched", "mismatched"):
    _register(f"bert_glue_mnli_{_which}",
              seqio.TfdsDataSource(f"glue/mnli:{GLUE_VERSION}",
                                   splits={"validation": f"validation_{_which}"}),
              [bp.frame_pair(BERT_VOCABULARY, GLUE["mnli"][0])], [metrics.accuracy], 3)

# ------------------------------------------------------------------------------ SQuAD, SWAG, NER
for _version, _tfds in (("v110", "squad/v1.1:3.*.*"), ("v200", "squad/v2.0:3.*.*")):
    _register(f"bert_squad_{_version}", seqio.TfdsDataSource(_tfds),
              [bp.frame_squad(BERT_VOCABULARY)], [metrics.squad])

_register("bert_hellaswag", seqio.TfdsDataSource("hellaswag:1.*.*"),
          [bp.frame_choices(BERT_VOCABULARY, "context", "endings")], [metrics.accuracy], 4,
          rank=2)  # (choices, length)

CONLL2003_TAGS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC",
                  "I-MISC")
_register("bert_conll2003_ner", seqio.TfdsDataSource("conll2003:1.*.*"),
          [bp.frame_tagging(BERT_VOCABULARY)], [metrics.conll_ner_f1(CONLL2003_TAGS)],
          len(CONLL2003_TAGS))


# ------------------------------------------------------------------------------ offline
MIN_WORDS_FOR_ORDER = 6


def word_order_examples(ds: tf.data.Dataset) -> tf.data.Dataset:
    """Offline documents -> sentences of >= 6 words; by a hash of the sentence, half keep
    their words (label 1) and half have them shuffled (label 0). Deterministic, so train and
    validation are fixed sets."""
    sentences = ds.map(lambda ex: bp.split_sentences(ex["text"])).unbatch()
    sentences = sentences.filter(
        lambda s: tf.size(tf.strings.split(s)) >= MIN_WORDS_FOR_ORDER)

    def label(sentence):
        digest = tf.strings.to_hash_bucket_fast(sentence, 2**31 - 1)
        words = tf.strings.split(sentence)
        shuffled = tf.random.experimental.stateless_shuffle(
            words, seed=tf.stack([digest, tf.constant(0, tf.int64)]))
        keep = digest % 2 == 1
        text = tf.where(keep, sentence, tf.strings.reduce_join(shuffled, separator=" "))
        return {"sentence": text, "label": tf.cast(keep, tf.int32)}

    return sentences.map(label, num_parallel_calls=tf.data.AUTOTUNE)


_register("bert_offline_word_order", offline.OFFLINE_SOURCE,
          [word_order_examples, bp.frame_pair(BERT_VOCABULARY, ("sentence",))],
          [metrics.accuracy], 2)
