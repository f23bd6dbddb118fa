"""An English corpus that needs no download: the prose that every Python installation ships.

Sources, read from the running interpreter's own standard library (PSF licence):
  * `pydoc_data.topics`, the language reference sections behind `help('if')` and friends;
  * the docstrings of the standard library's modules, classes and functions, read with `ast`
    (nothing is imported or executed).

Code samples, grammar rules and doctest lines are dropped; each remaining document (one topic
or docstring) becomes one line of text. The corpus is gathered once, written atomically under
the cache directory and reused; ~2% of documents (chosen by a hash of their text, so the split
is stable) form the validation split. A SentencePiece vocabulary is trained on the training
split, also once, and so is a WordPiece vocabulary for BERT.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import hashlib
import os
import re
import sysconfig
import tempfile
from typing import Iterator, Sequence

CORPUS_VERSION = "v1"
VALIDATION_PERCENT = 2
MIN_WORDS = 20
# A 1948-piece model plus seqio's 100 sentinel ids gives a 2048-entry vocabulary.
SPM_VOCAB_SIZE = 1948
NUM_SENTINELS = 100
# The WordPiece vocabulary for BERT on this corpus: the learner stops at ~2.5k pieces (the
# corpus is small), and the file is filled up to this size with [unusedN] pieces, as BERT's
# own vocab.txt has, so models see one fixed size whatever the Python version's corpus.
WORDPIECE_VOCAB_SIZE = 4096


def cache_dir() -> str:
    """Where the corpus and vocabulary live: $T5X_LIKE_CACHE or ~/.cache/t5x_like."""
    root = os.environ.get("T5X_LIKE_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "t5x_like"
    )
    return os.path.join(root, "offline_corpus", CORPUS_VERSION)


def split_path(split: str) -> str:
    return os.path.join(cache_dir(), f"{split}.txt")


def vocabulary_path() -> str:
    return os.path.join(cache_dir(), f"spm_{SPM_VOCAB_SIZE}.model")


def wordpiece_vocabulary_path() -> str:
    return os.path.join(cache_dir(), f"wordpiece_{WORDPIECE_VOCAB_SIZE}.txt")


# ------------------------------------------------------------------------- gathering
_CODE_LINE = re.compile(r"^\s*(>>>|\.\.\.|[-=*~^]{3,}$|[A-Za-z_]+\s*::=)")


def _prose_paragraphs(text: str) -> Iterator[str]:
    """Paragraphs of running text: no code blocks, grammar, doctests or rulers."""
    for block in re.split(r"\n\s*\n", text):
        lines = block.split("\n")
        if not lines or any(_CODE_LINE.match(line) for line in lines):
            continue
        indents = {len(line) - len(line.lstrip()) for line in lines if line.strip()}
        if len(indents) > 2:  # nested indentation: code or a table
            continue
        paragraph = " ".join(line.strip() for line in lines).strip()
        if not paragraph:
            continue
        letters = sum(c.isalpha() or c.isspace() for c in paragraph)
        if letters / len(paragraph) < 0.85 or not paragraph[0].isupper():
            continue
        yield paragraph


def _document(text: str) -> str | None:
    doc = " ".join(_prose_paragraphs(text))
    doc = re.sub(r"\s+", " ", doc).strip()
    return doc if len(doc.split()) >= MIN_WORDS else None


def _pydoc_topics() -> Iterator[str]:
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some minimal Python builds leave pydoc_data out
        return
    for name in sorted(topics):
        doc = _document(topics[name])
        if doc:
            yield doc


def _stdlib_docstrings() -> Iterator[str]:
    stdlib = sysconfig.get_paths()["stdlib"]
    skip = {"site-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__", "turtledemo"}
    for root, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in skip and not d.startswith("."))
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            try:
                with open(os.path.join(root, name), encoding="utf-8") as f:
                    tree = ast.parse(f.read())
            except (SyntaxError, UnicodeDecodeError, OSError):
                continue
            for node in ast.walk(tree):
                if isinstance(
                    node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
                ):
                    text = ast.get_docstring(node)
                    doc = _document(text) if text else None
                    if doc:
                        yield doc


def gather_documents() -> list[str]:
    """All documents, de-duplicated, in a fixed order."""
    seen: set[str] = set()
    documents = []
    for doc in (*_pydoc_topics(), *_stdlib_docstrings()):
        if doc not in seen:
            seen.add(doc)
            documents.append(doc)
    return documents


def is_validation(document: str) -> bool:
    digest = hashlib.sha256(document.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") % 100 < VALIDATION_PERCENT


def _write_atomically(path: str, content: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(content)
    os.replace(tmp, path)


@contextlib.contextmanager
def _build_lock(name: str) -> Iterator[None]:
    """One builder at a time across processes (the hosts of a multi-process run, test
    workers): the others wait, then find the file built."""
    os.makedirs(cache_dir(), exist_ok=True)
    with open(os.path.join(cache_dir(), f".{name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _cached(paths: Sequence[str]) -> bool:
    return all(os.path.exists(p) for p in paths)


def ensure_corpus() -> dict[str, str]:
    """Gather the corpus unless cached; returns {split: path}."""
    paths = {split: split_path(split) for split in ("train", "validation")}
    if _cached(list(paths.values())):
        return paths
    with _build_lock("corpus"):
        if not _cached(list(paths.values())):
            _gather_corpus(paths)
    return paths


def _gather_corpus(paths: dict[str, str]) -> None:
    documents = gather_documents()
    if len(documents) < 100:
        raise RuntimeError(
            f"Only {len(documents)} documents of prose found in this Python's standard library "
            f"({sysconfig.get_paths()['stdlib']}); the offline corpus needs a full CPython "
            "installation (with pydoc_data and the library sources)."
        )
    validation = [d for d in documents if is_validation(d)]
    train = [d for d in documents if not is_validation(d)]
    _write_atomically(paths["validation"], "\n".join(validation) + "\n")
    _write_atomically(paths["train"], "\n".join(train) + "\n")


def ensure_vocabulary() -> str:
    """Train the SentencePiece model on the training split unless cached; returns its path.

    T5's id layout: 0 pad, 1 EOS, 2 unknown, no BOS.
    """
    path = vocabulary_path()
    if os.path.exists(path):
        return path
    with _build_lock("spm"):
        if not os.path.exists(path):
            _train_sentencepiece(path)
    return path


def _train_sentencepiece(path: str) -> None:
    import sentencepiece as spm

    corpus = ensure_corpus()["train"]
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        prefix = os.path.join(tmp, "spm")
        spm.SentencePieceTrainer.train(
            input=corpus,
            model_prefix=prefix,
            vocab_size=SPM_VOCAB_SIZE,
            model_type="unigram",
            pad_id=0,
            eos_id=1,
            unk_id=2,
            bos_id=-1,
            character_coverage=1.0,
            input_sentence_size=200_000,
            shuffle_input_sentence=True,
            num_threads=2,
            max_sentence_length=1 << 16,
            minloglevel=2,
        )
        os.replace(prefix + ".model", path)


def ensure_wordpiece_vocabulary() -> str:
    """Learn an uncased WordPiece vocab.txt on the training split unless cached (~40 s once);
    returns its path. [PAD] [UNK] [CLS] [SEP] [MASK] are ids 0-4."""
    path = wordpiece_vocabulary_path()
    if os.path.exists(path):
        return path
    with _build_lock("wordpiece"):
        if not os.path.exists(path):
            _learn_wordpiece(path)
    return path


def _learn_wordpiece(path: str) -> None:
    import tensorflow as tf

    from t5x_like.data import wordpiece

    with tf.init_scope():  # the learner runs eagerly, even if first asked inside a tf.function
        texts = tf.data.TextLineDataset(ensure_corpus()["train"])
        pieces = wordpiece.build_vocab(texts, WORDPIECE_VOCAB_SIZE, lower_case=True)
    pieces = pieces[:WORDPIECE_VOCAB_SIZE]
    pieces += [f"[unused{i}]" for i in range(WORDPIECE_VOCAB_SIZE - len(pieces))]
    _write_atomically(path, "\n".join(pieces) + "\n")
