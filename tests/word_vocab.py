"""A word-level seqio vocabulary for tests: one token per space-separated word, as the T5
paper's Table 3 assumes ("all words are mapped to a single token by our vocabulary")."""

from __future__ import annotations

from typing import Sequence

import seqio
import tensorflow as tf

SPECIALS = ("<pad>", "</s>", "<unk>")


class WordVocabulary(seqio.Vocabulary):
    """ids 0/1/2 = pad/EOS/UNK, then `words`, then `extra_ids` sentinels counting down from the
    top (`<extra_id_0>` = vocab_size - 1), like T5's SentencePiece vocabularies."""

    def __init__(self, words: Sequence[str], extra_ids: int = 10):
        self._words = list(SPECIALS) + list(words)
        self._ids = {w: i for i, w in enumerate(self._words)}
        super().__init__(extra_ids=extra_ids)
        self._table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(self._words), tf.range(len(self._words), dtype=tf.int32)
            ),
            default_value=2,
        )
        self._pieces = tf.constant(self.pieces())

    def pieces(self) -> list[str]:
        return self._words + [f"<extra_id_{self.extra_ids - 1 - i}>" for i in range(self.extra_ids)]

    @property
    def eos_id(self) -> int:
        return 1

    @property
    def unk_id(self) -> int:
        return 2

    @property
    def _base_vocab_size(self) -> int:
        return len(self._words)

    def _encode(self, s: str) -> list[int]:
        return [self._ids.get(w, 2) for w in s.split()]

    def _decode(self, ids) -> str:
        pieces = self.pieces()
        return " ".join(pieces[int(i)] for i in ids if int(i) not in (0, 1))

    def _encode_tf(self, s: tf.Tensor) -> tf.Tensor:
        return self._table.lookup(tf.strings.split(s))

    def _decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
        ids = tf.boolean_mask(ids, ids > 1)
        return tf.strings.reduce_join(tf.gather(self._pieces, ids), separator=" ")
