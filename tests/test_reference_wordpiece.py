"""WordPiece ids and BERT masking's random tokens, against Google BERT's own code.

Reference: bert-tensorflow 1.0.4 (Google's BERT release), run by tests/oracles/bert_tokenizer.py
in a process of its own:
* `tokenization.FullTokenizer` (lower-cased and cased): our `WordPieceVocabulary` must give
  the same ids on 3,000 sentences of the offline corpus (the standard library's documentation;
  all ~2.7k documents in `slow`), on hard cases, and on every code point in a sample of
  Unicode (all of it in `slow`),
  on a vocabulary learned by our builder plus hand-added pieces (cased words, accented letters,
  '##' continuations, CJK, full-width forms, ...). transformers' Python port of the same code
  (`tokenization_bert_legacy`) is a second, in-process oracle on the corpus and hard cases.
  (transformers' default, Rust-backed `BertTokenizer` is not one: it keeps a 100-character
  word limit, lower-cases without the final sigma and reads older Unicode tables.)
* `create_pretraining_data.py`'s random replacement, `vocab_words[rng.randint(0,
  len(vocab_words) - 1)]`: our masking's random tokens must follow its distribution given "not
  [PAD]" (our features read id 0 as padding), by chi-square tests whose bounds are stated below.

Both sides read Unicode tables of their own version (Python's `unicodedata`, ICU/RE2 in
TensorFlow): code points unassigned in Python's `unicodedata` are left out of the sweeps.
"""

from __future__ import annotations

import re
import string
import unicodedata

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from t5x_like.data import wordpiece
from t5x_like.families.bert import pretraining_data as bert_data
from tests.oracle import run_oracle

# Hand-added pieces: cased words and letters, accented letters and combining marks, and the
# hard cases' scripts, each also as a '##' continuation, so they are covered rather than [UNK].
_EXTRA_LETTERS = (
    string.ascii_letters + string.digits + "éÉèüÜñçàøØłŁßẞﬁﬂσςΣαβγΑΒΓάΆ"
    "ıİiıабвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВГДЕЁЖЗИЙКЛМНОПРСТУФХЦЧШЩЪЫЬЭЮЯ"
    "ａｂｃＡＢＣ１２３ｶﾞカガがかアイウ한국어ㅎㅏㄴ\u0301\u0308\u0327\u3099"
    "東京中文日本語汉字𠀀…🙂👍🏽\ue000"
)
_EXTRA_WORDS = [
    "The",
    "Python",
    "BERT",
    "Hello",
    "World",
    "Café",
    "café",
    "naïve",
    "Straße",
    "strasse",
    "ﬁne",
    "fine",
    "ΟΔΟΣ",
    "οδος",
    "οδοσ",
    "İstanbul",
    "istanbul",
    "Москва",
    "москва",
    "ＡＢＣ",
    "ａｂｃ",
    "un",
    "##aff",
    "##able",
    "[unused7]",
]

# Strings on which tokenizers part ways: normalization, character classes, word limits.
HARD_CASES = [
    "The unaffable runs!",
    "Hello, World. BERT's tokenizer: (numbers 12,345.67) & $5^2`~|",
    # accents, lower-casing, NFD
    "Café naïve résumé — ÀÉÎÕÜ; Øresund Łódź façade Ünïcödé",
    "cafe\u0301 CAFE\u0301 ÇA",
    "İstanbul ISTANBUL ıi",
    "Ά ά ΆΈΉ",
    # ligatures, sharp s, full-width forms, compatibility characters
    "ﬁne ﬂow ﬃ ﬁ",
    "Straße STRASSE ẞ ß",
    "ＡＢＣ ａｂｃ １２３！？（ｘ）～￥",
    "ｶﾞ ガ が Ⅻ ½ ² ℌ Ω Å",
    # Greek final sigma (ICU's and Python's full lower-casing agree)
    "ΟΔΟΣ ΟΔΟΣ. ΑΣ.Σ Σ ΑΣΑ ΌΣΟΣ's",
    "ΣΑΣ ΣΣ aΣ Σa",
    # control characters, U+FFFD, NUL, zero-width characters, BOM, soft hyphen, private use
    "a\x00b c\x01d e\x7ff g\x85h i\x9fj",
    "x\ufffdy \ufffd z\ufffd",
    "co\u00adoperate",
    "zero\u200bwidth \u200cjoin\u200dER \ufeffbom \u2060wj \u202eRTL\u202c",
    "a\ue000b \ue000",
    "a\x0bb c\x0cd \x1c\x1d\x1e\x1f",
    # whitespace of every kind
    "tabs\tand\nnewlines\r\nand\u3000ideographic\u00a0nbsp\u2009thin\u202fnarrow",
    "line\u2028separator\u2029paragraph \u1680ogham",
    "   ",
    "",
    "\t\n\r ",
    # combining marks alone and stacked, variation selectors, keycaps, emoji
    "\u0301start e\u0301\u0308\u0327 ̈",
    "1\ufe0f\u20e3 #\ufe0f\u20e3",
    "🙂 🙂🙂 a🙂b",
    "👍🏽 👩\u200d💻 🏳️\u200d🌈 🇩🇪",
    "☃ ★ ♥ ∑ ∞ → ← ✓",
    # CJK (BMP, compatibility, extension B), Chinese punctuation, kana, hangul
    "東京は日本の首都です。",
    "中文，标点！问号？顿号、分号；冒号：「引号」『书名』（括号）《书》",
    "汉字𠀀𠀁 兀豈 〇〡",
    "アイウ がかき 한국어 조선말",
    # ellipsis, dashes, quotes, other punctuation
    "Wait… what…? «quoted» „low“ ‘single’ — – ‐ ‹›",
    "§1 ¶2 †‡ •·‧ ※ ‰ ′″ ¿¡",
    # mixed scripts in one word and sentence
    "Москва Moscow москва MOSCOW",
    "abcабв123 αβγabc",
    "عربي مُشَكَّل עִבְרִית हिन्दी ไทย",
    "[UNK] [CLS] [SEP] [MASK] [PAD] [unused7]",
    # long words around the reference's 200-character limit (characters, after normalization)
    *["a" * n for n in (99, 100, 101, 150, 199, 200, 201, 250)],
    *["é" * n for n in (100, 101, 150, 200, 201)],  # 2 bytes a character
    "e\u0301" * 100,
    "e\u0301" * 101,
    "ab" * 75,
    "Ａ" * 150,
    "ﬁ" * 120,
    "🙂" * 150,
    "a" * 150 + "." + "b" * 150 + "," + "c" * 201,
    ("word " * 300).strip(),
]

# Undecodable UTF-8, which the reference decodes with errors ignored.
HARD_BYTES = [
    b"caf\xc3",
    b"\xff\xfeabc",
    b"a\xe2\x82b c",
    b"\xed\xa0\x80x",
    b"\xc0\xafx",
    b"ok \x80\x81 fine",
    "naïve".encode() + b"\xe9",
]

# Blocks sampled for the fast sweep (all assigned code points in `slow`): Latin to CJK
# symbols, CJK boundaries, the compatibility and full-width forms, specials, emoji.
_SWEEP_RANGES = [
    (0x0, 0x3400),
    (0x4DB0, 0x4E10),
    (0x9FF0, 0xA010),
    (0xA640, 0xA720),
    (0xF8F0, 0x10000),
    (0x1F000, 0x1FB00),
    (0x20000, 0x20010),
    (0x2A6D0, 0x2A710),
    (0x2CEA0, 0x2CEB8),
    (0x2F800, 0x2F810),
    (0x2FA10, 0x2FA28),
    (0xE0000, 0xE0080),
]


def _assigned(code_points) -> list[int]:
    return [
        c for c in code_points if not 0xD800 <= c <= 0xDFFF and unicodedata.category(chr(c)) != "Cn"
    ]


def _sweep(code_points) -> list[str]:
    """Each code point inside a word, alone, and between upper-case letters."""
    return [f"a{chr(c)}b {chr(c)} A{chr(c)}B" for c in code_points]


FAST_SWEEP = _assigned(c for lo, hi in _SWEEP_RANGES for c in range(lo, hi))


@pytest.fixture(scope="module")
def vocab_path(tmp_path_factory) -> str:
    """The offline corpus's vocabulary (learned by our builder) plus the hand-added pieces,
    each piece once (the reference would give a repeated piece its first id)."""
    from t5x_like import offline_corpus

    with open(offline_corpus.ensure_wordpiece_vocabulary(), encoding="utf-8") as f:
        learned = [line.rstrip("\n") for line in f]
    cased = [
        w for p in learned if not p.startswith(("[", "##")) for w in (p.capitalize(), p.upper())
    ]
    letters = [p for ch in _EXTRA_LETTERS for p in (ch, "##" + ch)]
    pieces = list(dict.fromkeys(learned + cased + letters + _EXTRA_WORDS))
    path = tmp_path_factory.mktemp("reference_wordpiece") / "vocab.txt"
    path.write_text("\n".join(pieces) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def quirky_vocab_path(tmp_path_factory) -> str:
    """A vocab.txt as people write them: repeated pieces, spaces around pieces, CRLF, a blank
    line (the reference gives "" an id of its own)."""
    lines = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        "the",
        "  cat ",
        "the",
        "sat\r",
        "\ton",
        "",
        "##s",
        "cat",
        "mat",
        "##s",
        ".",
    ]
    path = tmp_path_factory.mktemp("quirky_wordpiece") / "vocab.txt"
    path.write_bytes(("\n".join(lines) + "\n").encode("utf-8"))
    return str(path)


@pytest.fixture(scope="module")
def random_vocab_path(tmp_path_factory) -> str:
    """A 32-piece vocabulary, small enough for a chi-square test over every id."""
    pieces = list(wordpiece.SPECIAL_TOKENS) + [f"w{i}" for i in range(27)]
    path = tmp_path_factory.mktemp("random_wordpiece") / "vocab.txt"
    path.write_text("\n".join(pieces) + "\n")
    return str(path)


def _documents() -> list[str]:
    """The offline corpus: one document (a stdlib docstring or help topic) a line."""
    from t5x_like import offline_corpus

    paths = offline_corpus.ensure_corpus()
    texts = []
    for split in ("train", "validation"):
        with open(paths[split], encoding="utf-8") as f:
            texts += [line.rstrip("\n") for line in f]
    return texts


def _sample_lines(documents: list[str], count: int = 3000) -> list[str]:
    """`count` sentences spread over the whole corpus (the fast tests' share of it)."""
    sentences = [s for d in documents for s in re.split(r"(?<=[.!?])\s+", d) if s]
    return sentences[:: max(1, len(sentences) // count)][:count]


RANDOM_DRAWS = 100_000
QUIRKY_TEXTS = ["The cats sat on the mat.", "the  cat", "sat on", "mats"]


@pytest.fixture(scope="module")
def documents() -> list[str]:
    return _documents()


@pytest.fixture(scope="module")
def corpus(documents) -> list[str]:
    return _sample_lines(documents)


@pytest.fixture(scope="module")
def reference(vocab_path, quirky_vocab_path, random_vocab_path, corpus):
    """One oracle process for the whole module: ids for every text in both modes."""
    texts = HARD_CASES + corpus + _sweep(FAST_SWEEP)
    hex_texts = [b.hex() for b in HARD_BYTES]
    runs = [
        {"vocab": vocab_path, "lower_case": lower, "texts": texts, "texts_hex": hex_texts}
        for lower in (True, False)
    ]
    runs.append({"vocab": quirky_vocab_path, "lower_case": True, "texts": QUIRKY_TEXTS})
    result = run_oracle(
        "bert_tokenizer",
        {
            "runs": runs,
            "random_tokens": {"vocab": random_vocab_path, "draws": RANDOM_DRAWS, "seed": 0},
        },
    )
    by_mode = {}
    for lower, run in zip((True, False), result["runs"]):
        n = len(HARD_CASES)
        by_mode[lower] = {
            "hard": run["ids"][:n],
            "corpus": run["ids"][n : n + len(corpus)],
            "sweep": run["ids"][n + len(corpus) :],
            "bytes": run["ids_hex"],
            "vocab_size": run["vocab_size"],
        }
    return {
        "modes": by_mode,
        "quirky": result["runs"][2],
        "random_tokens": {int(k): v for k, v in result["random_tokens"]["counts"].items()},
    }


def _ours(vocab: wordpiece.WordPieceVocabulary, texts) -> list[list[int]]:
    return vocab.tokenizer.tokenize(tf.constant(list(texts))).to_list()


def _assert_same(vocab, texts, ours, want, label):
    bad = [i for i, (a, b) in enumerate(zip(ours, want)) if a != b]
    pieces = vocab.pieces
    detail = [
        (texts[i][:60], [pieces[t] for t in ours[i]][:12], [pieces[t] for t in want[i]][:12])
        for i in bad[:5]
    ]
    assert len(ours) == len(want)
    assert not bad, f"{label}: {len(bad)} of {len(want)} differ from FullTokenizer: {detail}"


@pytest.mark.parametrize("lower_case", [True, False], ids=["uncased", "cased"])
def test_hard_cases_equal_full_tokenizer(reference, vocab_path, lower_case):
    vocab = wordpiece.WordPieceVocabulary(vocab_path, lower_case=lower_case)
    want = reference["modes"][lower_case]
    assert vocab.vocab_size == want["vocab_size"]
    _assert_same(vocab, HARD_CASES, _ours(vocab, HARD_CASES), want["hard"], "hard cases")
    # seqio's encode (one string) and encode_tf, a scalar and a 2-D batch give the same ids
    for text, ids in zip(HARD_CASES[:8], want["hard"][:8]):
        assert vocab.encode(text) == ids
        assert vocab.encode_tf(tf.constant(text)).numpy().tolist() == ids
        assert vocab.tokenizer.tokenize(tf.constant(text)).numpy().tolist() == ids
    grid = vocab.tokenizer.tokenize(tf.reshape(tf.constant(HARD_CASES[:8]), [2, 4]))
    assert grid.to_list() == [want["hard"][:4], want["hard"][4:8]]
    raw = [tf.constant(b) for b in HARD_BYTES]
    ours = [vocab.encode_tf(t).numpy().tolist() for t in raw]
    _assert_same(vocab, [repr(b) for b in HARD_BYTES], ours, want["bytes"], "undecodable bytes")


@pytest.mark.parametrize("lower_case", [True, False], ids=["uncased", "cased"])
def test_corpus_equals_full_tokenizer(reference, vocab_path, corpus, lower_case):
    vocab = wordpiece.WordPieceVocabulary(vocab_path, lower_case=lower_case)
    want = reference["modes"][lower_case]["corpus"]
    assert len(corpus) == 3000 and sum(map(len, want)) > 50_000
    _assert_same(vocab, corpus, _ours(vocab, corpus), want, "offline corpus")
    # inside tf.data, as the preprocessors run it
    ds = tf.data.Dataset.from_tensor_slices(corpus[:200]).map(vocab.encode_tf)
    assert [x.tolist() for x in ds.as_numpy_iterator()] == want[:200]


@pytest.mark.parametrize("lower_case", [True, False], ids=["uncased", "cased"])
def test_code_point_sweep_equals_full_tokenizer(reference, vocab_path, lower_case):
    vocab = wordpiece.WordPieceVocabulary(vocab_path, lower_case=lower_case)
    texts = _sweep(FAST_SWEEP)
    _assert_same(
        vocab, texts, _ours(vocab, texts), reference["modes"][lower_case]["sweep"], "code points"
    )


@pytest.mark.slow
@pytest.mark.parametrize("lower_case", [True, False], ids=["uncased", "cased"])
def test_whole_corpus_and_every_code_point_equal_full_tokenizer(vocab_path, documents, lower_case):
    """Every document of the offline corpus (~1.1 MB), and every code point assigned in
    Python's `unicodedata`."""
    texts = documents + _sweep(_assigned(range(0x110000)))
    want = run_oracle(
        "bert_tokenizer",
        {"runs": [{"vocab": vocab_path, "lower_case": lower_case, "texts": texts}]},
    )["runs"][0]["ids"]
    vocab = wordpiece.WordPieceVocabulary(vocab_path, lower_case=lower_case)
    _assert_same(vocab, texts, _ours(vocab, texts), want, "whole corpus and every code point")


@pytest.mark.parametrize("lower_case", [True, False], ids=["uncased", "cased"])
def test_transformers_python_port_agrees(reference, vocab_path, corpus, lower_case):
    """The second oracle: transformers' Python BasicTokenizer and WordpieceTokenizer (a port
    of Google's), with the reference's 200-character limit. It drops every category C*
    character where the reference drops Cc and Cf only, so private-use text is left out, and
    it composes the text (NFC) first, which only the cased mode can tell, so that mode is
    compared on composed text only."""
    legacy = pytest.importorskip("transformers.models.bert.tokenization_bert_legacy")
    pieces = wordpiece.read_vocab(vocab_path)
    ids = {p: i for i, p in enumerate(pieces)}
    basic = legacy.BasicTokenizer(do_lower_case=lower_case)
    pieces_of = legacy.WordpieceTokenizer(ids, "[UNK]", max_input_chars_per_word=200)
    texts = [
        t
        for t in HARD_CASES + corpus
        if not any(unicodedata.category(ch) in ("Co", "Cs", "Cn") for ch in t)
        and (lower_case or unicodedata.is_normalized("NFC", t))
    ]
    want = [[ids[p] for w in basic.tokenize(t) for p in pieces_of.tokenize(w)] for t in texts]
    vocab = wordpiece.WordPieceVocabulary(vocab_path, lower_case=lower_case)
    _assert_same(vocab, texts, _ours(vocab, texts), want, "transformers' Python port")


def test_vocab_file_read_as_the_reference_reads_it(reference, quirky_vocab_path):
    """Pieces stripped of surrounding whitespace; a repeated piece keeps its first id."""
    vocab = wordpiece.WordPieceVocabulary(quirky_vocab_path)
    want = reference["quirky"]
    assert vocab.vocab_size == want["vocab_size"]
    assert [vocab.encode(t) for t in QUIRKY_TEXTS] == want["ids"]


# ------------------------------------------------------------ masking's random replacement
def _our_random_replacements(vocab_size: int, sequences: int, seed: int = 0):
    """Run our masking on `sequences` instances whose ordinary tokens are all id 5; every
    predicted position left neither [MASK] nor 5 shows a random draw (draws of 4 or 5 cannot
    be told apart from the other branches, so those two ids are not observed)."""
    mask, original = 4, 5
    rng = np.random.default_rng(seed)
    tokens = [2] + [original] * 60 + [3] + [original] * 63 + [3]  # [CLS] A [SEP] B [SEP]
    counts = np.zeros(vocab_size, np.int64)
    for _ in range(sequences):
        out, positions, _ = bert_data.mask_tokens(tokens, (2, 3), mask, vocab_size, 20, rng)
        assert out[0] == 2 and out[61] == 3 and out[-1] == 3
        for p in positions:
            counts[out[p]] += 1
        assert 0 not in out, "a random replacement drew id 0 ([PAD])"
    counts[[mask, original]] = 0
    return counts


def test_random_replacement_follows_the_reference_without_pad(reference, random_vocab_path):
    """(a) id 0 is never drawn; (b) our random tokens are uniform over the observable ids (all
    but [PAD], [MASK] and the original) and (c) distributed as the reference's draws of those
    ids. Each chi-square bound is the 1 - 1e-6 quantile of its distribution under the null
    (df = cells - 1), so an honest implementation fails with probability 1e-6 at this sample
    size (~12k of our draws over 29 ids, 100k of the reference's over 32)."""
    vocab_size = len(wordpiece.read_vocab(random_vocab_path))
    reference_counts = np.zeros(vocab_size, np.int64)
    for token, count in reference["random_tokens"].items():
        reference_counts[token] = count
    # The reference does draw [PAD] (uniform over all 32 words): we exclude it deliberately.
    assert reference_counts.sum() == RANDOM_DRAWS and reference_counts[0] > 0
    ours = _our_random_replacements(vocab_size, sequences=7000)
    observed = [i for i in range(vocab_size) if i not in (0, 4, 5)]
    assert ours[0] == 0
    assert ours[observed].sum() > 10_000
    bound = stats.chi2.ppf(1 - 1e-6, len(observed) - 1)
    goodness = stats.chisquare(ours[observed]).statistic
    assert goodness < bound, f"not uniform: chi2 {goodness:.1f} >= {bound:.1f}"
    table = np.stack([ours[observed], reference_counts[observed]])
    homogeneity = stats.chi2_contingency(table, correction=False).statistic
    assert homogeneity < bound, f"differs from the reference: chi2 {homogeneity:.1f}"


def test_random_token_is_uniform_over_all_ids_but_padding():
    """The draw itself, many times: every id but 0 occurs, uniformly (same bound as above)."""
    rng = np.random.default_rng(1)
    vocab_size = 50
    counts = np.bincount(
        [bert_data.random_token(vocab_size, rng) for _ in range(50_000)], minlength=vocab_size
    )
    assert counts[0] == 0 and (counts[1:] > 0).all()
    assert stats.chisquare(counts[1:]).statistic < stats.chi2.ppf(1 - 1e-6, vocab_size - 2)
