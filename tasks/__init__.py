"""seqio task registrations. Importing this package registers every task (no network, no
heavy work: data and vocabularies are built or read when a dataset is first requested)."""

from . import bert, c4, generation, glue, gpt, mixtures, offline, text_corpus  # noqa: F401
