"""GPT-2's byte-level BPE and GPT-1's BPE as seqio vocabularies (`t5x_like.data.bpe`) give the
ids of transformers 4.57.6's pure-Python `GPT2Tokenizer` and `OpenAIGPTTokenizer` (run in an
oracle process, requirements/oracles_transformers4.txt) on real English text, and decode back.

No released vocabulary can be downloaded here, so each test learns one, in the release's file
format, from real prose that ships with Python (`pydoc_data.topics`, the language reference),
and checks on text held out from it, with Unicode, digits, punctuation and runs of spaces.
"""

from __future__ import annotations

import json

import pytest
import tensorflow as tf

from t5x_like.data import bpe
from tests.oracle import TRANSFORMERS4, run_oracle

HELD_OUT = [
    "The quick brown fox jumps over the lazy dog.",
    "Comprehensions  (list, set, dict) evaluate   lazily?  Not quite: 3.14 != 22/7.",
    "Naïve café façade — déjà vu, 東京 and emoji 🙂 too.\nA second line\tafter a tab.",
    "  leading spaces, trailing spaces  ",
    "",
]


def _prose(n_topics: int = 60) -> list[str]:
    from pydoc_data.topics import topics

    return [topics[k] for k in sorted(topics)[:n_topics]]


def _gpt2_files(directory) -> tuple[str, str]:
    from tokenizers import ByteLevelBPETokenizer

    learner = ByteLevelBPETokenizer()
    learner.train_from_iterator(_prose(), vocab_size=700, special_tokens=[bpe.GPT2_END_OF_TEXT])
    learner.save_model(str(directory))  # vocab.json + merges.txt, GPT-2's layout
    return str(directory / "vocab.json"), str(directory / "merges.txt")


def _gpt1_files(directory) -> tuple[str, str]:
    """GPT-1's layout: encoder_bpe_40000.json (token -> id, `</w>` ending a word) and
    vocab_40000.bpe (a version line, then one merge a line)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    learner = Tokenizer(models.BPE(unk_token=bpe.GPT1_UNKNOWN, end_of_word_suffix="</w>"))
    learner.normalizer = normalizers.BertNormalizer(lowercase=True)
    learner.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=700, special_tokens=[bpe.GPT1_UNKNOWN], end_of_word_suffix="</w>"
    )
    learner.train_from_iterator(_prose(), trainer)
    saved = json.loads(learner.to_str())["model"]
    encoder, merges = directory / "encoder_bpe_40000.json", directory / "vocab_40000.bpe"
    encoder.write_text(json.dumps(saved["vocab"]))
    lines = [m if isinstance(m, str) else " ".join(m) for m in saved["merges"]]
    merges.write_text("#version: 0.2\n" + "\n".join(lines) + "\n")
    return str(encoder), str(merges)


@pytest.mark.parametrize("kind", ["gpt2", "gpt1"])
def test_ids_equal_transformers_tokenizers(tmp_path, kind):
    vocab, merges = (_gpt2_files if kind == "gpt2" else _gpt1_files)(tmp_path)
    ours = bpe.BPEVocabulary(vocab, merges, kind)
    reference = run_oracle(
        "transformers_tf_loaders",
        {"format": "bpe", "kind": kind, "vocab": vocab, "merges": merges, "texts": HELD_OUT},
        packages=TRANSFORMERS4,
    )
    for text, want, decoded in zip(HELD_OUT, reference["ids"], reference["decoded"]):
        assert ours.encode(text) == want, text
        assert ours.encode_tf(tf.constant(text)).numpy().tolist() == want, text
        assert ours.decode(want) == decoded
        assert ours.decode_tf(tf.constant(want, tf.int32)).numpy().decode() == decoded
    if kind == "gpt2":  # byte-level: every string comes back exactly
        assert all(ours.decode(ours.encode(t)) == t for t in HELD_OUT)
        assert ours.eos_id == json.load(open(vocab))[bpe.GPT2_END_OF_TEXT]
    else:
        assert ours.eos_id is None and ours.unk_id == 0


def test_a_missing_file_is_named(tmp_path):
    vocab, _ = _gpt2_files(tmp_path)
    with pytest.raises(FileNotFoundError, match="nothing.txt does not exist"):
        bpe.BPEVocabulary(vocab, str(tmp_path / "nothing.txt"), "gpt2")
    with pytest.raises(ValueError, match="kind='gpt3'"):
        bpe.BPEVocabulary(vocab, vocab, "gpt3")
