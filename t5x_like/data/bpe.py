"""GPT-2's byte-level BPE and GPT-1's BPE as seqio Vocabularies, through HuggingFace `tokenizers`.

GPT-2 (`vocab.json` + `merges.txt`, as OpenAI's `encoder.json` + `vocab.bpe`): text is split by
GPT-2's regular expression and mapped to bytes (`ByteLevel`), then merged; every string
round-trips, and `<|endoftext|>` is its end of text. GPT-1 (`encoder_bpe_40000.json` +
`vocab_40000.bpe`): text is lower-cased and split as BERT's basic tokenizer does (the way
transformers' `OpenAIGPTTokenizer` reads it when ftfy and spaCy are absent, and its fast
tokenizer always), then merged with `</w>` ending a word; GPT-1 has no end-of-text token.

Both are built the way transformers' own conversion builds its fast tokenizers
(`convert_slow_tokenizer.GPT2Converter` / `OpenAIGPTConverter`), so ids equal transformers'
tokenizers'; the tests check that against transformers' pure-Python ones on real text.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Sequence

import seqio
import tensorflow as tf

from t5x_like import storage

GPT2_END_OF_TEXT = "<|endoftext|>"
GPT1_UNKNOWN = "<unk>"
KINDS = ("gpt2", "gpt1")


@functools.lru_cache(maxsize=8)
def _tokenizer(kind: str, vocab_path: str, merges_path: str) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab = json.loads(storage.read_text(vocab_path))
    merges = _merges(merges_path)
    if kind == "gpt2":
        tokenizer = Tokenizer(models.BPE(vocab, merges, fuse_unk=False))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        if GPT2_END_OF_TEXT in vocab:
            tokenizer.add_special_tokens([GPT2_END_OF_TEXT])
        return tokenizer
    unk = GPT1_UNKNOWN if GPT1_UNKNOWN in vocab else None
    tokenizer = Tokenizer(models.BPE(vocab, merges, unk_token=unk, end_of_word_suffix="</w>"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.BPEDecoder(suffix="</w>")
    return tokenizer


def _merges(path: str) -> list[tuple[str, str]]:
    """The merge rules, one "left right" pair a line after an optional `#version` line."""
    merges = []
    # "\n" only, as transformers reads the file: a merge may hold U+0085 or U+2028.
    for number, line in enumerate(storage.read_text(path).split("\n"), 1):
        line = line.rstrip("\r")
        if not line or line.startswith("#version"):
            continue
        pair = line.split(" ")
        if len(pair) != 2:
            raise ValueError(f"{path}:{number}: {line!r} is not a merge rule ('left right').")
        merges.append((pair[0], pair[1]))
    return merges


class BPEVocabulary(seqio.Vocabulary):
    """A BPE vocabulary file pair: `kind` 'gpt2' (byte-level) or 'gpt1'. `extra_ids` adds
    ids past the file's (as seqio's SentencePiece vocabularies do for sentinels)."""

    # Id 0 is a real token (GPT-2's '!'), so decoded ids are never cut at 0 (`evaluation`).
    ZERO_IS_A_TOKEN = True

    def __init__(self, vocab_path: str, merges_path: str, kind: str, extra_ids: int = 0) -> None:
        if kind not in KINDS:
            raise ValueError(f"BPEVocabulary kind={kind!r}; one of {KINDS}.")
        for path in (vocab_path, merges_path):
            if not storage.exists(path):
                raise FileNotFoundError(f"{path} does not exist: a BPE vocabulary needs it.")
        self.vocab_path, self.merges_path, self.kind = vocab_path, merges_path, kind
        super().__init__(extra_ids=extra_ids)

    @property
    def tokenizer(self) -> Any:
        return _tokenizer(self.kind, self.vocab_path, self.merges_path)

    @property
    def eos_id(self) -> int | None:
        return self.tokenizer.token_to_id(GPT2_END_OF_TEXT) if self.kind == "gpt2" else None

    @property
    def unk_id(self) -> int | None:
        return self.tokenizer.token_to_id(GPT1_UNKNOWN) if self.kind == "gpt1" else None

    @property
    def pad_id(self) -> int:
        """seqio pads with id 0 (in GPT-2's vocabulary '!'); models read padding from
        lengths or masks, never from the id."""
        return 0

    @property
    def _base_vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def _encode(self, s: str) -> list[int]:
        return self.tokenizer.encode(s, add_special_tokens=False).ids

    def _decode(self, ids: Sequence[int]) -> str:
        base = self._base_vocab_size
        return self.tokenizer.decode([int(i) for i in ids if 0 <= int(i) < base])

    def _encode_tf(self, s: tf.Tensor) -> tf.Tensor:
        def encode(text: tf.Tensor) -> Any:
            return tf.constant(self._encode(text.numpy().decode("utf-8")), tf.int32)

        ids = tf.py_function(encode, [s], tf.int32)
        ids.set_shape([None])
        return ids

    def _decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
        def decode(values: tf.Tensor) -> Any:
            return tf.constant(self._decode(values.numpy().tolist()))

        text = tf.py_function(decode, [ids], tf.string)
        text.set_shape([])
        return text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BPEVocabulary) and (
            other.vocab_path,
            other.merges_path,
            other.kind,
            other.extra_ids,
        ) == (self.vocab_path, self.merges_path, self.kind, self.extra_ids)

    def __hash__(self) -> int:
        return hash((self.vocab_path, self.merges_path, self.kind, self.extra_ids))
