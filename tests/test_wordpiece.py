"""WordPiece vocabulary: the reference tokenizer's own docstring example ("unaffable", Google
BERT tokenization.py `WordpieceTokenizer.tokenize`), the build tool, cased vocabularies and
refused files. Agreement with Google BERT's FullTokenizer itself, id for id, is tested in
test_reference_wordpiece.py."""

import pytest
import tensorflow as tf

from t5x_like.data import wordpiece

HAND_VOCAB = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "the",
    "un",
    "##aff",
    "##able",
    "runs",
    "!",
    "cafe",
    ".",
]
SENTENCES = [
    "The unaffable runs!",
    "Hello, World. This is BERT's tokenizer: it splits punctuation (and numbers 12,345).",
    "Café naïve résumé — ÀÉÎÕÜ; 東京 is two CJK characters.",
    "Unseenwordzzzz and emoji 🙂 become unknown pieces.",
    "   multiple   spaces\tand\nnewlines   ",
]


@pytest.fixture(scope="module")
def learned_vocab(tmp_path_factory):
    """A WordPiece vocab learned by the build tool from the offline corpus."""
    from t5x_like import offline_corpus

    directory = tmp_path_factory.mktemp("wordpiece")
    path = directory / "vocab.txt"
    # A quarter of the offline corpus is plenty for a 2000-piece vocabulary, in a quarter of
    # the time.
    with open(offline_corpus.ensure_corpus()["train"]) as f:
        lines = f.readlines()
    corpus = directory / "corpus.txt"
    corpus.write_text("".join(lines[: len(lines) // 4]))
    pieces = wordpiece.main(["--input", str(corpus), "--output", str(path), "--vocab_size", "2000"])
    assert pieces[:5] == list(wordpiece.SPECIAL_TOKENS)
    return path


def test_hand_checked_sentence(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(HAND_VOCAB) + "\n")
    vocab = wordpiece.WordPieceVocabulary(str(path))
    ids = vocab.encode("The unaffable runs!")
    assert [HAND_VOCAB[i] for i in ids] == ["the", "un", "##aff", "##able", "runs", "!"]
    assert vocab.encode("Café.") == [11, 12]  # lower-cased, accent stripped
    assert vocab.encode("unknownword") == [vocab.unk_id]
    assert (vocab.pad_id, vocab.unk_id, vocab.cls_id, vocab.sep_id, vocab.mask_id) == (
        0,
        1,
        2,
        3,
        4,
    )
    assert vocab.decode(ids) == "the unaffable runs !"
    assert vocab.encode_tf(tf.constant("the runs")).numpy().tolist() == [5, 9]


def test_built_vocabulary_covers_its_corpus(learned_vocab):
    """The build tool's vocab.txt loads, and covers the prose it was learned from (ids equal
    to Google BERT's FullTokenizer are tested in test_reference_wordpiece.py)."""
    vocab = wordpiece.WordPieceVocabulary(str(learned_vocab))
    ids = [i for s in SENTENCES[:2] for i in vocab.encode(s)]
    assert len(ids) > 20 and vocab.unk_id not in ids
    assert all(0 <= i < vocab.vocab_size for i in ids)


def test_cased_vocabulary_keeps_case(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(HAND_VOCAB + ["The"]) + "\n")
    cased = wordpiece.WordPieceVocabulary(str(path), lower_case=False)
    assert cased.encode("The the") == [13, 5]


def test_vocab_without_special_tokens_is_refused(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("a\nb\n")
    with pytest.raises(ValueError, match=r"lacks BERT's special tokens \['\[PAD\]'"):
        wordpiece.WordPieceVocabulary(str(path))
