"""BERT's WordPiece vocabulary as a seqio Vocabulary, and a tool to build one from local text.

    python -m t5x_like.data.wordpiece --input 'corpus/*.txt' --vocab_size 8000 --output vocab.txt

The vocabulary reads a standard `vocab.txt` (one piece a line, continuation pieces prefixed
with '##', the line number is the id) and tokenizes with tensorflow-text's FastBertTokenizer:
BERT's basic tokenizer (optional lower-casing with accent stripping, splitting on whitespace,
punctuation and CJK characters) followed by greedy longest-match-first WordPiece. [PAD],
[UNK], [CLS], [SEP] and [MASK] ids come from the file.
"""

from __future__ import annotations

import argparse
import glob
import sys
from typing import Callable, Sequence

import seqio
import tensorflow as tf

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def read_vocab(path: str) -> list[str]:
    with tf.io.gfile.GFile(path) as f:
        pieces = [line.rstrip("\n") for line in f]
    missing = [t for t in SPECIAL_TOKENS if t not in pieces]
    if missing:
        raise ValueError(f"{path} lacks BERT's special tokens {missing}; a WordPiece vocab.txt "
                         f"lists {', '.join(SPECIAL_TOKENS)} among its pieces.")
    return pieces


class WordPieceVocabulary(seqio.Vocabulary):
    """A `vocab.txt` with BERT's tokenizer. There is no EOS: BERT frames sequences with
    [CLS]/[SEP], which the pretraining and fine-tuning preprocessors add."""

    def __init__(self, vocab_path: str | Callable[[], str],
                 lower_case: bool | Callable[[], bool] = True) -> None:
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
    def tokenizer(self):
        """tensorflow-text's FastBertTokenizer, built on first use."""
        key = (self.vocab_path, self.lower_case)
        if self._tokenizer_for is None or self._tokenizer_for[0] != key:
            import tensorflow_text as tf_text

            self._tokenizer_for = (key, tf_text.FastBertTokenizer(
                self._pieces, suffix_indicator="##", unknown_token="[UNK]",
                token_out_type=tf.int32, support_detokenization=True,
                lower_case_nfd_strip_accents=self.lower_case))
        return self._tokenizer_for[1]

    def _encode_tf(self, s: tf.Tensor) -> tf.Tensor:
        # One string at a time (seqio's contract); the tokenizer wants a batch of them.
        return tf.cast(self.tokenizer.tokenize(tf.reshape(s, [1])).flat_values, tf.int32)

    def _encode(self, s: str) -> list[int]:
        return self._encode_tf(tf.constant(s)).numpy().tolist()

    def _decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
        words = self.tokenizer.detokenize(tf.expand_dims(ids, 0))
        return tf.strings.reduce_join(words, separator=" ")

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
        return (isinstance(other, WordPieceVocabulary)
                and other._vocab_path == self._vocab_path
                and other._lower_case == self._lower_case)

    def __hash__(self) -> int:
        return hash((self._vocab_path, self._lower_case))


# ----------------------------------------------------------------------- building
def build_vocab(texts: tf.data.Dataset, vocab_size: int, lower_case: bool = True,
                reserved_tokens: Sequence[str] = SPECIAL_TOKENS) -> list[str]:
    """Learn a WordPiece vocabulary (tensorflow-text's BERT vocab learner) from a dataset of
    strings; the special tokens come first, so [PAD] is id 0."""
    from tensorflow_text.tools.wordpiece_vocab import bert_vocab_from_dataset as learner

    return learner.bert_vocab_from_dataset(
        texts.batch(1000).prefetch(2), vocab_size=vocab_size,
        reserved_tokens=list(reserved_tokens),
        bert_tokenizer_params={"lower_case": lower_case}, learn_params={})


def main(argv: Sequence[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", action="append", required=True,
                        help="text file or glob, one document (or sentence) a line; repeatable")
    parser.add_argument("--output", required=True, help="vocab.txt to write")
    parser.add_argument("--vocab_size", type=int, default=30522)
    parser.add_argument("--cased", action="store_true", help="keep case and accents")
    args = parser.parse_args(argv)
    paths = sorted(p for pattern in args.input for p in glob.glob(pattern))
    if not paths:
        raise SystemExit(f"No input files match {args.input}.")
    texts = tf.data.TextLineDataset(paths)
    pieces = build_vocab(texts, args.vocab_size, lower_case=not args.cased)
    with tf.io.gfile.GFile(args.output, "w") as f:
        f.write("\n".join(pieces) + "\n")
    print(f"wrote {len(pieces)} pieces to {args.output}")
    return pieces


if __name__ == "__main__":
    main(sys.argv[1:])
