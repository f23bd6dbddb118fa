"""C4 pretraining tasks (T5 paper section 2.2) on the TFDS `c4/en` dataset.

`c4_v220_span_corruption` keeps t5's name so configs carry over; every other objective of the
paper's section 3.3 is registered next to it (`c4_v220_bert_style`, ..., see tasks/pretraining.py).
T5 used c4/en 3.0.1; TFDS 4.9
builds 3.1.0; `c4/en:3.*.*` accepts either, whichever is prepared in the TFDS data_dir.

Without the 7 TB build: bind `c4_files.json_dir='/data/c4/en'` (or set T5X_LIKE_C4_JSON_DIR)
to read downloaded shards in the mirrored `c4-train.*.json.gz` layout instead of TFDS.

The vocabulary is T5's 32k SentencePiece model with 100 sentinels. Its default location is the
public t5 bucket, readable from TPU VMs; set T5X_LIKE_C4_SPM to a local copy elsewhere.
"""

from __future__ import annotations

import os

import seqio

from t5x_like.data import text_files

from . import pretraining

C4_TFDS_NAME = "c4/en:3.*.*"
DEFAULT_C4_SPM = "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model"
NUM_SENTINELS = 100


def c4_vocabulary() -> seqio.SentencePieceVocabulary:
    return seqio.SentencePieceVocabulary(
        os.environ.get("T5X_LIKE_C4_SPM", DEFAULT_C4_SPM), extra_ids=NUM_SENTINELS
    )


C4_TFDS_SOURCE = seqio.TfdsDataSource(tfds_name=C4_TFDS_NAME)


def c4_source() -> seqio.DataSource:
    """Downloaded JSON shards when `c4_files.json_dir` is bound, else TFDS `c4/en`."""
    json_dir = text_files.c4_json_dir()
    return text_files.c4_json_source(json_dir) if json_dir else C4_TFDS_SOURCE


C4_TASKS = pretraining.register_objectives(
    "c4_v220", source=text_files.LazySource(c4_source), vocabulary=c4_vocabulary()
)

# Plain language modelling on C4: `c4_v220_lm` (the T5 paper's "LM" rows of Table 2 for the
# decoder-only language model) and `c4_v220_full_lm` (EOS at each document's end; GPT).
C4_LM_TASKS = pretraining.register_language_models(
    "c4_v220", source=text_files.LazySource(c4_source), vocabulary=c4_vocabulary()
)
