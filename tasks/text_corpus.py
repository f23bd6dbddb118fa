"""Pretraining on your own corpus with any section 3.3 objective, no code needed:

    --gin.TASK=text_corpus_span_corruption   (or text_corpus_prefix_lm, _bert_style, _lm, ...)
    --gin.text_corpus.train_files="'/data/mine/*.jsonl.gz'"   (or *.txt: one document a line)
    --gin.text_corpus.validation_files="'/data/mine/val.jsonl.gz'"
    --gin.text_corpus.text_key="'text'"

The text is tokenized with T5's C4 vocabulary (`tasks/c4.py`; T5X_LIKE_C4_SPM for a local
copy). For another vocabulary or source, call `pretraining.register_objectives` in your own
module and `import` it from your gin file.
"""

from __future__ import annotations

from t5x_like.data import text_files

from . import c4, pretraining

TEXT_CORPUS_TASKS = pretraining.register_objectives(
    "text_corpus", text_files.LazySource(text_files.text_corpus_source), c4.c4_vocabulary()
)
TEXT_CORPUS_TASKS += pretraining.register_language_models(
    "text_corpus", text_files.LazySource(text_files.text_corpus_source), c4.c4_vocabulary()
)
