"""Pretraining text from local files: downloaded C4 shards and your own corpus.

Two seqio sources, both plain `FileDataSource`s (so multi-host runs split them by file):

* `JsonlDataSource`: JSON lines, optionally gzipped, one document per line under `text_key`
  (served as `text`; `url` and `timestamp` are kept). This reads the widely mirrored
  C4 layout `c4-train.00000-of-01024.json.gz` / `c4-validation.*.json.gz` as is.
* `TextFileDataSource`: plain text, one document per line.

A line longer than `text_files.max_document_chars` (default 1,000,000 characters) is split
into documents of that many characters, so one huge line cannot take gigabytes to tokenize.

Which files a task reads is decided when its data is first requested, after gin has parsed
the run's config, through `LazySource`:

    c4_files.json_dir = '/data/c4/en'      # every c4_v220_* task reads these shards, not TFDS
    text_corpus.train_files = '/data/mine/*.jsonl.gz'    # the text_corpus_* tasks
    text_corpus.validation_files = '/data/mine/val.jsonl.gz'
"""

from __future__ import annotations

import functools
import gzip
import json
import os
from typing import Callable, Mapping, Sequence

import gin
import seqio
import tensorflow as tf

from t5x_like.errors import ConfigError

JSON_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz")


def _compression(path: tf.Tensor) -> tf.Tensor:
    return tf.where(tf.strings.regex_full_match(path, r".*\.gz"), "GZIP", "")


def utf8_lines(path: tf.Tensor) -> tf.data.Dataset:
    """The file's lines, each checked to be UTF-8: a line that is not fails the pipeline with
    the file's name (the run's start-up check, `check_text_files`, reads only the first MiB of
    each file). Blank lines are dropped: one document per line, none empty."""

    def checked(line):
        valid = tf.equal(
            tf.strings.unicode_transcode(line, "UTF-8", "UTF-8", errors="replace"), line
        )
        # (The line itself is not in the message: TF's error text must be valid UTF-8.)
        assertion = tf.debugging.Assert(
            valid,
            [
                "A line of",
                path,
                "is not UTF-8 text; re-encode the file (e.g. iconv -f latin1 "
                "-t utf-8) or remove the line.",
            ],
        )
        with tf.control_dependencies([assertion]):
            return tf.identity(line)

    lines = tf.data.TextLineDataset(path, compression_type=_compression(path))
    return lines.filter(lambda l: tf.strings.length(tf.strings.strip(l)) > 0).map(checked)


def check_text_files(paths: Sequence[str], max_files: int = 64, max_bytes: int = 1 << 20) -> None:
    """Before a run starts: the first MiB of each of the first `max_files` files must be UTF-8
    text; the error names the file and the line."""
    for path in list(paths)[:max_files]:
        with tf.io.gfile.GFile(path, "rb") as f:
            if path.endswith(".gz"):
                with gzip.GzipFile(fileobj=f) as unzipped:
                    raw = unzipped.read(max_bytes)
            else:
                raw = f.read(max_bytes)
        lines = raw.split(b"\n")
        if len(raw) == max_bytes:
            lines = lines[:-1]  # (cut mid-line)
        for number, line in enumerate(lines, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ConfigError(
                    f"{path}, line {number}: not UTF-8 text (byte {line[e.start]:#04x} at "
                    f"column {e.start + 1}). Re-encode the file (e.g. `iconv -f latin1 -t "
                    "utf-8`) or remove the line."
                ) from None


# A JSON string literal, and any flat JSON value that may stand before the key we read.
_JSON_STRING = r'"(?:[^"\\]|\\.)*"'
_JSON_SCALAR = rf"(?:{_JSON_STRING}|-?[0-9][0-9.eE+-]*|true|false|null)"
_HEX_DIGITS = "0123456789abcdef"


def _json_field_pattern(key: str, value: str) -> str:
    """A JSON object whose top-level `key` holds a `value` (a regex), captured as written.
    Fields before it must be flat (strings, numbers, literals), as in C4's and most corpora's
    lines. The prefix is greedy, so of a key given twice the last is read, as json.loads
    reads it."""
    written = json.dumps(key, ensure_ascii=False)[1:-1]  # the key as a JSON file holds it
    escaped = "".join(
        "\\" + c if c.isascii() and not (c.isalnum() or c == "_") else c for c in written
    )
    return (
        rf'^\s*\{{(?:\s*{_JSON_STRING}\s*:\s*{_JSON_SCALAR}\s*,)*\s*"{escaped}"\s*:\s*'
        rf"({value})\s*[,}}].*$"
    )


def _hex_value(hex4: tf.Tensor) -> tf.Tensor:
    """'00e9' -> 233, for a vector of four-digit hex strings (TensorFlow parses no hex)."""
    digits = tf.strings.unicode_decode(tf.strings.lower(hex4), "UTF-8").to_tensor(shape=[None, 4])
    table = tf.constant([ord(c) for c in _HEX_DIGITS], tf.int32)
    values = tf.argmax(
        tf.cast(tf.equal(digits[..., None], table), tf.int32), axis=-1, output_type=tf.int32
    )
    return tf.reduce_sum(values * tf.constant([4096, 256, 16, 1]), axis=-1)


def _decode_unicode_escapes(body: tf.Tensor) -> tf.Tensor:
    r"""Decode the \uXXXX escapes of a JSON string body whose escaped backslashes stand as
    \x02 (no raw control character is valid JSON, so none collides), surrogate pairs
    included (a lone surrogate becomes U+FFFD), and put the backslashes back."""
    marked = tf.strings.regex_replace(body, r"\\u([0-9a-fA-F]{4})", "\x01\\1\x01")
    pieces = tf.strings.split(marked, "\x01")  # text, hex, text, hex, ..., text
    literal = tf.strings.regex_replace(pieces[0::2], "\x02", "\\\\")
    codes = _hex_value(pieces[1::2])
    # A high surrogate with an empty literal after it and a low surrogate next: one code point.
    high = (codes >= 0xD800) & (codes < 0xDC00)
    next_codes = tf.concat([codes[1:], [0]], 0)
    pair = high & (next_codes >= 0xDC00) & (next_codes < 0xE000) & tf.equal(literal[1:], "")
    is_low_of_pair = tf.concat([[False], pair[:-1]], 0)
    combined = tf.where(pair, 0x10000 + (codes - 0xD800) * 1024 + (next_codes - 0xDC00), codes)
    combined = tf.where((combined >= 0xD800) & (combined < 0xE000), 0xFFFD, combined)
    decoded = tf.where(is_low_of_pair, "", tf.strings.unicode_encode(combined[:, None], "UTF-8"))
    return (
        tf.strings.reduce_join(tf.stack([literal[:-1], decoded], axis=1), separator="")
        + literal[-1]
    )


def _decode_json_string(literal: tf.Tensor) -> tf.Tensor:
    """A JSON string literal (quotes included) -> its text."""
    body = tf.strings.substr(literal, 1, tf.strings.length(literal) - 2)
    body = tf.strings.regex_replace(body, r"\\\\", "\x02")  # escaped backslashes, first
    for escape, char in (
        ('"', '"'),
        ("/", "/"),
        ("b", "\b"),
        ("f", "\f"),
        ("n", "\n"),
        ("r", "\r"),
        ("t", "\t"),
    ):
        body = tf.strings.regex_replace(body, "\\\\" + escape, char.replace("\\", "\\\\"))
    return _decode_unicode_escapes(body)


def json_string_value(line: tf.Tensor, key: str) -> tuple[tf.Tensor, tf.Tensor]:
    """(found, value): the top-level string field `key` of a JSON-lines record, decoded with
    TensorFlow ops only, so the pipeline's position can be checkpointed (tf.py_function
    cannot be). Equal to json.loads(line)[key] on every line whose fields before the key are
    flat (tests/test_text_files.py)."""
    pattern = _json_field_pattern(key, _JSON_STRING)
    found = tf.strings.regex_full_match(line, pattern)
    literal = tf.where(found, tf.strings.regex_replace(line, pattern, r"\1"), '""')
    return found, _decode_json_string(literal)


def json_scalar_text(line: tf.Tensor, key: str) -> tf.Tensor:
    """A kept field as text: a string decoded, a number or literal as written, '' when the
    line has no such flat field (e.g. `timestamp` given as seconds)."""
    pattern = _json_field_pattern(key, _JSON_SCALAR)
    found = tf.strings.regex_full_match(line, pattern)
    raw = tf.where(found, tf.strings.regex_replace(line, pattern, r"\1"), '""')
    is_string = tf.strings.regex_full_match(raw, _JSON_STRING)
    return tf.cond(is_string, lambda: _decode_json_string(raw), lambda: raw)


def read_jsonl(
    path: tf.Tensor, text_key: str = "text", keep_keys: Sequence[str] = ("url", "timestamp")
) -> tf.data.Dataset:
    """One file of JSON lines -> string features: the document under `text` (read from
    `text_key`, so every source looks the same to the tasks) and `keep_keys` ('' when a line
    has none). Parsed with TensorFlow ops, so a run's input position is saved with its
    checkpoints and a resume restores it instead of re-reading every earlier batch."""
    keys = (text_key,) + tuple(k for k in keep_keys if k not in (text_key, "text"))
    names = ("text",) + keys[1:]

    def to_features(line):
        found, text = json_string_value(line, text_key)
        assertion = tf.debugging.Assert(
            found,
            [
                "A JSON line of",
                path,
                f"has no top-level string field {text_key} (or a nested "
                "value stands before it): set the source's text_key (text_corpus.text_key) or fix "
                "the line.",
            ],
        )
        with tf.control_dependencies([assertion]):
            features = {"text": tf.identity(text)}
        for key, name in zip(keys[1:], names[1:]):
            features[name] = json_scalar_text(line, key)
        return features

    return utf8_lines(path).map(to_features, num_parallel_calls=tf.data.AUTOTUNE)


@gin.configurable("text_files")
def document_char_limit(max_document_chars: int | None = 1_000_000) -> int | None:
    """Longest document (in characters) a text source passes on whole; a longer line is split
    into consecutive documents of at most this many characters (`split_long_documents`).
    SentencePiece holds about 100 bytes per character of the string it tokenizes, so one
    50 MB line would take ~5 GB; C4's longest cleaned page is ~190k characters, so the default
    splits only what is not a web page or book chapter. None or 0 turns splitting off.
    Bind `text_files.max_document_chars` in gin."""
    if max_document_chars is not None and max_document_chars < 0:
        raise ConfigError(
            f"text_files.max_document_chars={max_document_chars}; give a "
            "positive number of characters (or None / 0 for no limit)."
        )
    return max_document_chars or None


def split_long_documents(dataset: tf.data.Dataset, limit: int | None) -> tf.data.Dataset:
    """Each document (a dict with `text`) of over `limit` characters becomes consecutive
    documents of `limit` characters (the last shorter), other fields repeated; shorter ones
    pass unchanged. TensorFlow ops only (map + unbatch), so the pipeline's position stays
    checkpointable. Splits fall on UTF-8 character boundaries, never inside a character."""
    if not limit:
        return dataset

    def pieces(features):
        text = features["text"]
        length = tf.strings.length(text, unit="UTF8_CHAR")
        starts = tf.range(0, tf.maximum(length, 1), limit)
        texts = tf.cond(
            length > limit,
            lambda: tf.strings.substr(
                text, starts, tf.fill(tf.shape(starts), limit), unit="UTF8_CHAR"
            ),
            lambda: text[None],
        )
        count = tf.shape(texts)[0]
        return {k: texts if k == "text" else tf.repeat(v[None], count) for k, v in features.items()}

    return dataset.map(pieces).unbatch()


class JsonlDataSource(seqio.FileDataSource):
    """JSON-lines files (C4's mirrored layout or your own), one document per line."""

    def __init__(
        self,
        split_to_filepattern: Mapping[str, str | Sequence[str]],
        text_key: str = "text",
        keep_keys: Sequence[str] = ("url", "timestamp"),
    ):
        limit = document_char_limit()  # (here: an error in `read` surfaces as TF's)

        def read(path):
            return split_long_documents(read_jsonl(path, text_key, keep_keys), limit)

        super().__init__(read, split_to_filepattern)


class TextFileDataSource(seqio.FileDataSource):
    """Plain text files, one document per line (gzipped files too)."""

    def __init__(self, split_to_filepattern: Mapping[str, str | Sequence[str]]):
        limit = document_char_limit()

        def read(path):
            return split_long_documents(utf8_lines(path).map(lambda l: {"text": l}), limit)

        super().__init__(read, split_to_filepattern)


def files_source(
    split_to_filepattern: Mapping[str, str | Sequence[str]], text_key: str = "text"
) -> seqio.FileDataSource:
    """JSONL when every pattern names .json/.jsonl(.gz) files, else plain text lines."""
    patterns = [
        p for v in split_to_filepattern.values() for p in ([v] if isinstance(v, str) else v)
    ]
    if all(p.endswith(JSON_SUFFIXES) for p in patterns):
        return JsonlDataSource(split_to_filepattern, text_key)
    return TextFileDataSource(split_to_filepattern)


class LazySource(seqio.DataSource):
    """A source chosen when data is first requested (after gin parsed the run's bindings).

    `resolve()` returns the real source; every DataSource call is forwarded to it.
    """

    def __init__(
        self,
        resolve: Callable[[], seqio.DataSource],
        splits: Sequence[str] = ("train", "validation"),
    ):
        super().__init__(splits=splits)
        self._declared_splits = tuple(splits)
        self._resolve = resolve

    def __getattr__(self, name: str):
        """Anything else (e.g. `tfds_dataset`) is the resolved source's."""
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.source, name)

    @property
    def source(self) -> seqio.DataSource:
        return self._resolve()

    @property
    def splits(self) -> Sequence[str]:
        """The resolved source's splits (a corpus without validation files has none); the
        declared ones while the source cannot say (gin not parsed, TFDS data not prepared)."""
        try:
            return self.source.splits or self._declared_splits
        except Exception:  # noqa: BLE001 - unbound gin, unprepared TFDS data: not known yet
            return self._declared_splits

    @property
    def supports_arbitrary_sharding(self) -> bool:
        return self.source.supports_arbitrary_sharding

    def list_shards(self, split: str) -> Sequence[str]:
        return self.source.list_shards(split)

    def num_input_examples(self, split: str) -> int | None:
        return self.source.num_input_examples(split)

    def get_dataset(
        self,
        split: str = "train",
        shuffle: bool = True,
        seed: int | None = None,
        shard_info: seqio.ShardInfo | None = None,
        **kwargs,
    ) -> tf.data.Dataset:
        return self.source.get_dataset(
            split=split, shuffle=shuffle, seed=seed, shard_info=shard_info, **kwargs
        )

    def __repr__(self) -> str:
        return f"LazySource({self._resolve.__name__})"


# ----------------------------------------------------------------------- C4 shards
@gin.configurable("c4_files")
def c4_json_dir(json_dir: str | None = None) -> str | None:
    """Directory of downloaded C4 shards (`c4-train.*.json.gz`, `c4-validation.*.json.gz`);
    None reads TFDS `c4/en`. The environment variable T5X_LIKE_C4_JSON_DIR also sets it."""
    return json_dir or os.environ.get("T5X_LIKE_C4_JSON_DIR") or None


def c4_json_source(json_dir: str) -> JsonlDataSource:
    return JsonlDataSource(
        {
            "train": os.path.join(json_dir, "c4-train.*.json*"),
            "validation": os.path.join(json_dir, "c4-validation.*.json*"),
        }
    )


# ----------------------------------------------------------------------- your corpus
@gin.configurable("text_corpus")
def text_corpus_source(
    train_files: str | Sequence[str] | None = None,
    validation_files: str | Sequence[str] | None = None,
    text_key: str = "text",
) -> seqio.FileDataSource:
    """Your own corpus for the `text_corpus_*` tasks: globs of .txt (one document per line) or
    .jsonl/.json(.gz) files (`text_key` per line)."""
    if not train_files:
        raise ConfigError(
            "The text_corpus_* tasks read your files: bind "
            "text_corpus.train_files='/path/*.jsonl.gz' (or *.txt) and "
            "text_corpus.validation_files=... in gin."
        )
    splits = {"train": train_files}
    if validation_files:
        splits["validation"] = validation_files
    else:
        _say_once(
            "text_corpus.validation_files is not bound: the text_corpus_* tasks have no "
            "validation split, so runs on them do not evaluate (the training files are "
            "never used for validation)."
        )
    return files_source(splits, text_key)


@functools.cache
def _say_once(message: str) -> None:
    """Print a notice once per process (a LazySource resolves its source on every access)."""
    print(f"t5x_like: {message}", flush=True)
