"""BERT's WordPiece vocabulary as a seqio Vocabulary, and a tool to build one from local text.

    python -m t5x_like.data.wordpiece --input 'corpus/*.txt' --vocab_size 8000 --output vocab.txt

The vocabulary reads a standard `vocab.txt` (one piece a line, continuation pieces prefixed
with '##', read as Google BERT's `load_vocab` reads it) and tokenizes exactly as Google BERT's
`tokenization.FullTokenizer` (`BertTokenizer` below): BERT's basic tokenizer (optional
lower-casing with accent stripping, splitting on whitespace, punctuation and CJK characters)
followed by greedy longest-match-first WordPiece. [PAD], [UNK], [CLS], [SEP] and [MASK] ids
come from the file.
"""

from __future__ import annotations

import argparse
import glob
import sys
from typing import Callable, Sequence

import seqio
import tensorflow as tf

from t5x_like import logs

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def read_vocab(path: str) -> list[str]:
    """The pieces of a vocab.txt, the list index being the id. As the reference's `load_vocab`
    (Google BERT, tokenization.py) reads it: each line stripped of surrounding whitespace, and a
    piece met again keeps its first id (later ids close up), so ids equal FullTokenizer's."""
    with tf.io.gfile.GFile(path) as f:
        pieces = list(dict.fromkeys(line.strip() for line in f))
    missing = [t for t in SPECIAL_TOKENS if t not in pieces]
    if missing:
        raise ValueError(
            f"{path} lacks BERT's special tokens {missing}; a WordPiece vocab.txt "
            f"lists {', '.join(SPECIAL_TOKENS)} among its pieces."
        )
    return pieces


class WordPieceVocabulary(seqio.Vocabulary):
    """A `vocab.txt` with BERT's tokenizer. There is no EOS: BERT frames sequences with
    [CLS]/[SEP], which the pretraining and fine-tuning preprocessors add."""

    def __init__(
        self, vocab_path: str | Callable[[], str], lower_case: bool | Callable[[], bool] = True
    ) -> None:
        """`vocab_path` (and `lower_case`) may be functions, called on use, so a task can be
        registered before its vocabulary exists (built, or named by gin)."""
        self._vocab_path = vocab_path
        self._lower_case = lower_case
        self._loaded: tuple[str, list[str], dict[str, int]] | None = None
        self._tokenizer_for: tuple[str, object] | None = None
        super().__init__(extra_ids=0)
        if not callable(vocab_path):
            self._load()  # a named file is checked now

    @property
    def lower_case(self) -> bool:
        value = self._lower_case
        return bool(value() if callable(value) else value)

    @property
    def vocab_path(self) -> str:
        path = self._vocab_path
        return path() if callable(path) else path

    @property
    def _pieces(self) -> list[str]:
        return self._load()[1]

    @property
    def _ids(self) -> dict[str, int]:
        return self._load()[2]

    def _load(self) -> tuple[str, list[str], dict[str, int]]:
        """Read the file, again whenever the path (e.g. a gin binding) has changed."""
        path = self.vocab_path
        if self._loaded is None or self._loaded[0] != path:
            pieces = read_vocab(path)
            self._loaded = (path, pieces, {p: i for i, p in enumerate(pieces)})
        return self._loaded

    # ----------------------------------------------------------------- special ids
    @property
    def pad_id(self) -> int:
        return self._ids["[PAD]"]

    @property
    def unk_id(self) -> int:
        return self._ids["[UNK]"]

    @property
    def eos_id(self) -> None:
        return None

    @property
    def cls_id(self) -> int:
        return self._ids["[CLS]"]

    @property
    def sep_id(self) -> int:
        return self._ids["[SEP]"]

    @property
    def mask_id(self) -> int:
        return self._ids["[MASK]"]

    @property
    def pieces(self) -> list[str]:
        return list(self._pieces)

    @property
    def _base_vocab_size(self) -> int:
        return len(self._pieces)

    # ----------------------------------------------------------------- tokenizing
    @property
    def tokenizer(self) -> BertTokenizer:
        """BERT's tokenizer on this vocabulary (`BertTokenizer` below), built on first use."""
        key = (self.vocab_path, self.lower_case)
        if self._tokenizer_for is None or self._tokenizer_for[0] != key:
            self._tokenizer_for = (key, BertTokenizer(self._pieces, self.lower_case))
        return self._tokenizer_for[1]

    def _encode_tf(self, s: tf.Tensor) -> tf.Tensor:
        # One string at a time (seqio's contract); the tokenizer wants a batch of them.
        return tf.cast(self.tokenizer.tokenize(tf.reshape(s, [1])).flat_values, tf.int32)

    def _encode(self, s: str) -> list[int]:
        return self._encode_tf(tf.constant(s)).numpy().tolist()

    def _decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
        return self.tokenizer.detokenize(tf.expand_dims(ids, 0))[0]

    def _decode(self, ids: Sequence[int]) -> str:
        ids = [int(i) for i in ids if int(i) != self.pad_id]
        words: list[str] = []
        for piece in (self._pieces[i] for i in ids):
            if piece.startswith("##") and words:
                words[-1] += piece[2:]
            else:
                words.append(piece)
        return " ".join(words)

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, WordPieceVocabulary)
            and other._vocab_path == self._vocab_path
            and other._lower_case == self._lower_case
        )

    def __hash__(self) -> int:
        return hash((self._vocab_path, self._lower_case))


# ------------------------------------------------------------------ BERT's tokenizer
# BERT's basic tokenizer (Devlin et al., 2018; Google BERT, tokenization.py `BasicTokenizer`),
# each step a regular expression over the UTF-8 text, with the reference's character classes.
# Dropped: NUL, U+FFFD and the categories Cc and Cf (`_is_control`), except tab, LF and CR.
_DROPPED = r"[^\P{Cc}\t\n\r]|[\x{FFFD}\p{Cf}]"
# Whitespace (`_is_whitespace`: tab, LF, CR, Zs); U+2028/U+2029 are not, but the reference's
# `str.split()` splits words at them all the same.
_WHITESPACE = r"[\t\n\r\p{Zs}\x{2028}\x{2029}]"
# `_is_chinese_char`: the CJK Unified Ideographs blocks, each character a word of its own.
_CJK = (
    r"([\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{20000}-\x{2A6DF}\x{2A700}-\x{2B73F}"
    r"\x{2B740}-\x{2B81F}\x{2B820}-\x{2CEAF}\x{F900}-\x{FAFF}\x{2F800}-\x{2FA1F}])"
)
# `_is_punctuation`: every ASCII character that is not a letter, digit or space, and category P*.
_PUNCTUATION = r"([!-/:-@\[-`{-~]|\p{P})"
# The reference's WordpieceTokenizer gives [UNK] for a word of more than 200 characters.
MAX_CHARS_PER_WORD = 200


class BertTokenizer:
    """Google BERT's `FullTokenizer` in TensorFlow ops, id for id: the basic tokenizer (clean the
    text, split CJK characters off, lower-case then NFD and strip accents (category Mn) when
    `lower_case`, split on whitespace and punctuation), then greedy longest-match-first
    WordPiece (tensorflow-text's FastWordpieceTokenizer, which gives the same pieces in linear
    time), [UNK] for a word it cannot cover or one of more than 200 characters.

    tensorflow-text's own BERT normalizer (FastBertTokenizer, BertTokenizer) differs from the
    reference's: it applies NFKC case folding (ß -> ss, ﬁ -> fi, full-width -> ASCII), turns
    control characters into spaces where the reference drops them (a\x00b is one word there)
    and limits a word to 100 bytes, so it is only used for the WordPiece step. Lower-casing is
    ICU's full mapping (as Python's `str.lower`, final sigma included); both sides read Unicode
    tables of their own version, so characters assigned after Python's `unicodedata` version may
    still differ."""

    def __init__(
        self,
        pieces: Sequence[str],
        lower_case: bool = True,
        unknown_token: str = "[UNK]",
        max_chars_per_word: int = MAX_CHARS_PER_WORD,
    ) -> None:
        import tensorflow_text as tf_text

        self.lower_case = lower_case
        self.unknown_token = unknown_token
        self.max_chars_per_word = max_chars_per_word
        # A word never holds a space, so " " stands in for an empty line, which never matches.
        self._wordpiece = tf_text.FastWordpieceTokenizer(
            [p or " " for p in pieces],
            suffix_indicator="##",
            max_bytes_per_word=4 * max_chars_per_word,
            token_out_type=tf.int32,
            unknown_token=unknown_token,
            no_pretokenization=True,
            support_detokenization=True,
        )

    def basic_tokenize(self, text: tf.Tensor) -> tf.RaggedTensor:
        """Words of each string, shape text.shape + [(words)]."""
        import tensorflow_text as tf_text

        # Undecodable bytes are ignored, as the reference's `convert_to_unicode` does.
        text = tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="ignore")
        text = tf.strings.regex_replace(text, _DROPPED, "")
        text = tf.strings.regex_replace(text, _WHITESPACE, " ")
        text = tf.strings.regex_replace(text, _CJK, r" \1 ")
        if self.lower_case:
            text = tf.strings.lower(text, encoding="utf-8")
            text = tf.strings.regex_replace(tf_text.normalize_utf8(text, "NFD"), r"\p{Mn}", "")
        text = tf.strings.regex_replace(text, _PUNCTUATION, r" \1 ")
        return tf.strings.split(text)

    def tokenize(self, text: tf.Tensor) -> tf.RaggedTensor:
        """WordPiece ids of each string, shape text.shape + [(pieces)] (int32)."""
        text = tf.convert_to_tensor(text, tf.string)
        if text.shape.rank == 0:
            return self.tokenize(tf.reshape(text, [1]))[0]
        words = self.basic_tokenize(text)
        too_long = tf.strings.length(words.flat_values, unit="UTF8_CHAR") > self.max_chars_per_word
        words = words.with_flat_values(tf.where(too_long, self.unknown_token, words.flat_values))
        pieces = self._wordpiece.tokenize(words)  # (..., words, pieces)
        return pieces.merge_dims(-2, -1)

    def detokenize(self, ids: tf.Tensor | tf.RaggedTensor) -> tf.Tensor | tf.RaggedTensor:
        """Each row of ids as text: pieces joined, '##' continuations to their word."""
        return self._wordpiece.detokenize(ids)


# ----------------------------------------------------------------------- building
def build_vocab(
    texts: tf.data.Dataset,
    vocab_size: int,
    lower_case: bool = True,
    reserved_tokens: Sequence[str] = SPECIAL_TOKENS,
    on_read: Callable[[int], object] | None = None,
) -> list[str]:
    """Learn a WordPiece vocabulary (tensorflow-text's BERT vocab learner) from a dataset of
    strings; the special tokens come first, so [PAD] is id 0. `on_read(n)` is told the bytes
    of text (each string and its line end) as the learner counts them."""
    from tensorflow_text.tools.wordpiece_vocab import bert_vocab_from_dataset as learner

    batches = texts.batch(1000)
    if on_read is not None:
        batches = batches.map(lambda batch: _reporting(batch, on_read))
    return learner.bert_vocab_from_dataset(
        batches.prefetch(2),
        vocab_size=vocab_size,
        reserved_tokens=list(reserved_tokens),
        bert_tokenizer_params={"lower_case": lower_case},
        learn_params={},
    )


def _reporting(batch: tf.Tensor, on_read: Callable[[int], object]) -> tf.Tensor:
    """`batch`, after telling `on_read` its size in bytes as lines of a file (one call per
    batch of 1000 lines, so the Python call costs nothing next to tokenizing them)."""
    size = tf.reduce_sum(tf.strings.length(batch)) + tf.size(batch)
    told = tf.py_function(lambda n: (on_read(int(n)), 0)[1], [size], tf.int32)
    with tf.control_dependencies([told]):
        return tf.identity(batch)


def main(argv: Sequence[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--input",
        action="append",
        required=True,
        help="text file or glob, one document (or sentence) a line; repeatable",
    )
    parser.add_argument("--output", required=True, help="vocab.txt to write")
    parser.add_argument("--vocab_size", type=int, default=30522)
    parser.add_argument("--cased", action="store_true", help="keep case and accents")
    args = parser.parse_args(argv)
    paths = sorted(p for pattern in args.input for p in glob.glob(pattern))
    if not paths:
        raise SystemExit(f"No input files match {args.input}.")
    texts = tf.data.TextLineDataset(paths)
    # Progress against the files' sizes: the learner's counting pass reads them once.
    with logs.progress(
        desc="wordpiece count words",
        total=sum(tf.io.gfile.stat(p).length for p in paths),
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
    ) as bar:
        pieces = build_vocab(texts, args.vocab_size, lower_case=not args.cased, on_read=bar.update)
    with tf.io.gfile.GFile(args.output, "w") as f:
        f.write("\n".join(pieces) + "\n")
    logs.log(f"wrote {len(pieces)} pieces to {args.output}")
    return pieces


def console_main() -> int:
    """The `t5x-like-wordpiece` console command: `main` on the command line, exit code 0 (`main`
    returns what it did, for callers in Python)."""
    main(sys.argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(console_main())
