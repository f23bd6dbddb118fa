"""The offline default: span corruption on English prose shipped with Python itself.

Nothing is downloaded. The corpus (t5x_like.offline_corpus) and its 2048-entry vocabulary
(1948 SentencePiece pieces + 100 sentinels) are built on first use and cached.
"""

from __future__ import annotations

import seqio
import tensorflow as tf

from t5x_like import metrics, offline_corpus
from t5x_like.families.t5 import postprocessors

from . import pretraining


class OfflineVocabulary(seqio.SentencePieceVocabulary):
    """The offline corpus' SentencePiece model, trained on first use (not at import), from the
    cache directory in effect then ($T5X_LIKE_CACHE may be set after the tasks are imported)."""

    def __init__(self) -> None:
        super().__init__(offline_corpus.vocabulary_path(), extra_ids=offline_corpus.NUM_SENTINELS)

    def _model_context(self):
        if self._model is None:
            offline_corpus.ensure_vocabulary()
            self._sentencepiece_model_file = offline_corpus.vocabulary_path()
        return super()._model_context()


def _read_split(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
    del shuffle_files, seed  # one file per split; examples are shuffled downstream
    path = offline_corpus.ensure_corpus()[split]
    return tf.data.TextLineDataset(path).map(lambda line: {"text": line})


OFFLINE_SOURCE = seqio.FunctionDataSource(_read_split, splits=("train", "validation"))

OFFLINE_TASKS = pretraining.register_objectives("offline", OFFLINE_SOURCE, OfflineVocabulary())
# Causal language modelling on the same prose, for decoder-only models: `offline_lm` and
# `offline_full_lm` (EOS at each document's end).
pretraining.register_language_models("offline", OFFLINE_SOURCE, OfflineVocabulary())


@seqio.map_over_dataset
def _first_word(x):
    words = tf.strings.split(tf.strings.strip(x["text"]))
    return {
        "inputs": tf.strings.join(["first word:", x["text"]], separator=" "),
        "targets": words[0],
    }


# A small supervised text-to-text task on the same prose, for fine-tuning, evaluation and
# inference runs that need no download: "first word: <sentence>" -> its first word.
seqio.TaskRegistry.add(
    "offline_first_word",
    source=OFFLINE_SOURCE,
    preprocessors=[
        lambda ds: ds.filter(lambda x: tf.strings.length(tf.strings.strip(x["text"])) > 0),
        _first_word,
        seqio.preprocessors.tokenize,
        seqio.CacheDatasetPlaceholder(),
        seqio.preprocessors.append_eos_after_trim,
    ],
    output_features=pretraining.output_features(OfflineVocabulary()),
    postprocess_fn=postprocessors.decode_text,
    metric_fns=[metrics.accuracy],
)
