"""BERT pretraining data against the reference: Google BERT's create_pretraining_data.py
(bert-tensorflow 1.0.4), run by `tests/oracles/bert_pretraining.py` in its own process on the
same corpus file (one sentence per line, blank lines between documents) and the same
vocab.txt as our pipeline.

* The reference's corpus format: `t5x_like.tasks.bert.SentencePerLineSource` reads the same
  documents (ids, in order) as `create_training_instances` does.
* Its TFRecords: `bert_tfrecord_pretraining`'s source and `from_reference_records` give
  exactly the reference's instances, and the BERT feature converter exactly the records'
  padded features.
* Our pairs and masks (`pretraining_pairs`, dynamic masking over several passes, and static
  masking with `dupe_factor`) against the reference's instances, statistic by statistic:
  NotNext share, the share of instances from one-sentence documents (the reference makes a
  one-sentence chunk a NotNext pair), the masked share of tokens and the exact number masked
  at each sequence length (15% of all tokens, [CLS]/[SEP] included, at most
  max_predictions_per_seq), the 80/10/10 split of the masked tokens, the mean length and
  short-sequence share, the mean lengths of A and B, and where a NotNext B comes from (any
  document of the corpus: the share from A's own 64-document block, and from A's own
  document).

Bounds: each statistic is compared as the difference of two sample means, allowed `Z`
standard errors of that difference, each side's standard error cluster-robust with A's
document as the cluster (instances, and masked tokens, of one document are not independent):
se^2 = G/(G-1) * sum over clusters of (sum of x - mean)^2 / n^2, G clusters, n samples; and
never less than one sample's worth (1/min(n1, n2)). About 16 statistics are tested at once;
Z = 4 is two-sided 6.3e-5 each under normality, under 1.1e-3 for the family (Bonferroni), so
a correct pipeline fails about once in a thousand runs and a deviation of 4 standard errors
is caught half the time. The sequence-length distribution is compared bin by bin (the share
of lengths in each quarter of the maximum length). An event one side never shows while the
other's rate expects 20 or more of it fails too (so a one-sentence document that makes no
instance is caught at the default size, where its share's bound is wide). The default suite runs
~1,000 instances a side (a few seconds); `test_large_sample_statistics` (slow) runs ~25,000.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import seqio
import tensorflow as tf

from t5x_like.data.wordpiece import WordPieceVocabulary
from t5x_like.families.bert import features as bert_features
from t5x_like.families.bert import preprocessors as bp
from tests.oracle import run_oracle

Z = 4.0
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."]
WORDS_PER_DOCUMENT = 12
LENGTH, PREDICTIONS = 64, 10
BLOCK = 64  # the old pipeline's group of neighbouring documents


def _vocab(num_documents: int) -> list[str]:
    """Document d writes only the words d{d}w{j}: every token names its document."""
    return SPECIALS + [f"d{d}w{j}" for d in range(num_documents) for j in range(WORDS_PER_DOCUMENT)]


def _documents(num_documents: int, seed: int) -> list[list[str]]:
    """A quarter one-sentence documents, the rest 2-12 sentences of 2-30 words and '.'."""
    rng = np.random.default_rng(seed)
    documents = []
    for d in range(num_documents):
        sentences = 1 if rng.random() < 0.25 else int(rng.integers(2, 13))
        documents.append(
            [
                " ".join(
                    f"d{d}w{j}"
                    for j in rng.integers(0, WORDS_PER_DOCUMENT, int(rng.integers(2, 31)))
                )
                + " ."
                for _ in range(sentences)
            ]
        )
    return documents


def _corpus_text(documents: list[list[str]]) -> str:
    """The reference's format, with the irregularities it tolerates: blank lines before the
    first document, whitespace-only and repeated blank lines, stray spaces and tabs, and no
    newline at the end of the file."""
    parts = ["\n \n"]
    for d, document in enumerate(documents):
        lines = [f"  {s}\t" if (d + i) % 5 == 0 else s for i, s in enumerate(document)]
        parts.append("\n".join(lines))
        parts.append("\n\n\n" if d % 7 == 0 else ("\n \t\n" if d % 7 == 1 else "\n\n"))
    return "".join(parts).rstrip("\n")


def _oracle(
    folder, num_documents: int, dupe_factor: int, seed: int, write_records: bool = False
) -> tuple[dict, str, str, list[list[str]]]:
    documents = _documents(num_documents, seed)
    corpus = _corpus_text(documents)
    result = run_oracle(
        "bert_pretraining",
        {
            "dir": str(folder),
            "vocab": _vocab(num_documents),
            "corpus": corpus,
            "max_seq_length": LENGTH,
            "max_predictions_per_seq": PREDICTIONS,
            "dupe_factor": dupe_factor,
            "short_seq_prob": 0.1,
            "masked_lm_prob": 0.15,
            "random_seed": 12345,
            "write_records": write_records,
        },
    )
    return (
        result,
        os.path.join(folder, "reference_corpus.txt"),
        os.path.join(folder, "reference_vocab.txt"),
        documents,
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """ONE oracle run for the module: 120 documents, 3 copies, records written."""
    return _oracle(tmp_path_factory.mktemp("bert_reference"), 120, 3, seed=0, write_records=True)


def _source(corpus_path: str) -> seqio.DataSource:
    from t5x_like.tasks import bert

    return bert.SentencePerLineSource({"train": corpus_path})


def _ours(
    corpus_path: str, vocab_path: str, passes: int = 1, seed: int = 0, **options
) -> list[dict]:
    """Our instances: `passes` passes over the corpus file, each seeded by seqio."""
    vocab = WordPieceVocabulary(vocab_path)
    out = []
    for p in range(passes):
        ds = _source(corpus_path).get_dataset("train", shuffle=False)
        with seqio.utils.map_seed_manager(seed + 1000 * p):
            ds = bp.pretraining_pairs(vocab, **options)(
                ds, {"inputs": LENGTH, "targets": PREDICTIONS}
            )
        out += [{k: np.asarray(v).tolist() for k, v in x.items()} for x in ds.as_numpy_iterator()]
    return out


# ------------------------------------------------------------------------------ statistics
def _statistics(instances: list[dict], vocab: list[str], single: set[int]) -> dict:
    """Per-instance samples (0/1 or numbers) of each statistic, from instances as ids."""
    cls_id, sep_id, mask_id = (vocab.index(t) for t in ("[CLS]", "[SEP]", "[MASK]"))

    def document(ids):
        for i in ids:
            word = vocab[i]
            if word.startswith("d"):
                return int(word[1:].split("w")[0])
        return None

    s = {k: [] for k in STATISTICS}
    clusters = {k: [] for k in STATISTICS}
    counts: dict[int, set[int]] = {}
    for x in instances:
        ids, positions, targets = x["inputs"], x["masked_lm_positions"], x["targets"]
        original = list(ids)
        for p, t in zip(positions, targets):
            original[p] = t
        assert original[0] == cls_id and original[-1] == sep_id
        assert original.count(sep_id) == 2 and positions == sorted(set(positions))
        assert not {original[p] for p in positions} & {cls_id, sep_id}
        first_sep = original.index(sep_id)
        a, b = original[1:first_sep], original[first_sep + 1 : -1]
        assert x["segment_ids"] == [0] * (len(a) + 2) + [1] * (len(b) + 1)
        doc_a, doc_b = document(a), document(b)
        cluster = doc_a if doc_a is not None else -1 - len(s["length"])

        def add(name, value):
            s[name].append(value)
            clusters[name].append(cluster)

        add("not_next", x["next_sentence_labels"])
        add("one_sentence_document", int(doc_a in single))
        add("masked_share", len(positions) / len(ids))
        counts.setdefault(len(ids), set()).add(len(positions))
        add("length", len(ids))
        add("short", int(len(ids) < LENGTH // 2))
        for k in range(LENGTH_BINS):
            add(
                f"length_bin{k}",
                int(k * LENGTH // LENGTH_BINS < len(ids) <= (k + 1) * LENGTH // LENGTH_BINS),
            )
        add("length_a", len(a))
        add("length_b", len(b))
        for p, t in zip(positions, targets):
            add("masked_as_mask", int(ids[p] == mask_id))
            add("masked_kept", int(ids[p] == t))
            add("masked_random", int(ids[p] not in (mask_id, t)))
        if x["next_sentence_labels"] and doc_a is not None and doc_b is not None:
            add("b_in_a_block", int(doc_a // BLOCK == doc_b // BLOCK))
            add("b_from_a", int(doc_a == doc_b))
    return {"samples": s, "clusters": clusters, "counts": counts, "n": len(instances)}


LENGTH_BINS = 4
PROPORTIONS = (
    "not_next",
    "one_sentence_document",
    "short",
    "masked_as_mask",
    "masked_kept",
    "masked_random",
    "b_in_a_block",
    "b_from_a",
) + tuple(f"length_bin{k}" for k in range(LENGTH_BINS))
MEANS = ("masked_share", "length", "length_a", "length_b")
STATISTICS = PROPORTIONS + MEANS


def _clustered_se(x: np.ndarray, clusters: np.ndarray) -> float:
    """The cluster-robust standard error of the mean of x (clusters: A's document)."""
    _, which = np.unique(clusters, return_inverse=True)
    groups = np.bincount(which, weights=x - x.mean())
    g = len(groups)
    return math.sqrt(g / max(g - 1, 1) * np.sum(groups**2)) / len(x)


def _bound(x: np.ndarray, y: np.ndarray, cx: np.ndarray, cy: np.ndarray) -> float:
    se = math.hypot(_clustered_se(x, cx), _clustered_se(y, cy))
    return max(Z * se, 1 / min(len(x), len(y)))


def _assert_same_statistics(ours: dict, reference: dict) -> None:
    failures = []
    for name in PROPORTIONS + MEANS:
        x = np.asarray(ours["samples"][name], float)
        y = np.asarray(reference["samples"][name], float)
        assert len(x) and len(y), name
        bound = _bound(
            x, y, np.asarray(ours["clusters"][name]), np.asarray(reference["clusters"][name])
        )
        if abs(x.mean() - y.mean()) > bound:
            failures.append(
                f"{name}: ours {x.mean():.4f} (n={len(x)}), reference "
                f"{y.mean():.4f} (n={len(y)}), allowed difference {bound:.4f}"
            )
        # An event one side never shows though the other's rate expects 20 or more of it
        # (P(none) < e^-20 for independent samples; 20 documents' worth clustered).
        for a, b, side in ((x, y, "ours"), (y, x, "the reference")):
            if name in PROPORTIONS and a.sum() == 0 and b.mean() * len(a) >= 20:
                failures.append(
                    f"{name}: never seen in {side} (n={len(a)}), rate "
                    f"{b.mean():.4f} on the other side"
                )
    # The number masked is a function of the length in the reference: the same at each
    # length both produced.
    for length in set(ours["counts"]) & set(reference["counts"]):
        if ours["counts"][length] != reference["counts"][length]:
            failures.append(
                f"masked at length {length}: ours {ours['counts'][length]}, "
                f"reference {reference['counts'][length]}"
            )
    assert not failures, "\n".join(failures)


def _single(documents: list[list[str]]) -> set[int]:
    return {d for d, doc in enumerate(documents) if len(doc) == 1}


# ------------------------------------------------------------------------------ tests
def test_sentence_per_line_source_reads_the_reference_documents(reference):
    result, corpus, vocab_path, documents = reference
    vocab = WordPieceVocabulary(vocab_path)
    ds = _source(corpus).get_dataset("train", shuffle=False)
    ds = ds.map(lambda ex: bp.tokenize_sentences(vocab, bp.document_sentences(ex)))
    ours = [[np.asarray(s).tolist() for s in d] for d in ds.as_numpy_iterator()]
    assert len(result["documents"]) == len(documents)
    assert ours == result["documents"]


def test_dynamic_masking_statistics_equal_the_reference(reference):
    result, corpus, vocab_path, documents = reference
    vocab = _vocab(len(documents))
    theirs = _statistics(result["instances"], vocab, _single(documents))
    ours = _statistics(_ours(corpus, vocab_path, passes=3), vocab, _single(documents))
    _assert_same_statistics(ours, theirs)


def test_static_masking_equals_the_reference_statistics_and_repeats(reference):
    """dupe_factor=3 (as the oracle's): 3 copies of the corpus per pass, each masked
    differently, and the same 3 copies on every pass (the reference's fixed records)."""
    result, corpus, vocab_path, documents = reference
    vocab = _vocab(len(documents))
    first = _ours(corpus, vocab_path, passes=1, seed=0, dupe_factor=3)
    again = _ours(corpus, vocab_path, passes=1, seed=7, dupe_factor=3)
    assert first == again
    _assert_same_statistics(
        _statistics(first, vocab, _single(documents)),
        _statistics(result["instances"], vocab, _single(documents)),
    )
    once = _ours(corpus, vocab_path, passes=1, seed=0, dupe_factor=1)
    assert 2.5 < len(first) / len(once) < 3.5
    assert len({tuple(x["inputs"]) for x in first}) > 0.9 * len(first)


def test_tfrecord_source_reads_the_reference_records_exactly(reference):
    result, corpus, vocab_path, documents = reference
    from t5x_like.tasks import bert

    records = os.path.join(os.path.dirname(corpus), "reference.tfrecord")
    source = bert.tfrecord_source(train_files=records)
    ds = bp.from_reference_records(
        source.get_dataset("train", shuffle=False), {"inputs": LENGTH, "targets": PREDICTIONS}
    )
    ours = [{k: np.asarray(v).tolist() for k, v in x.items()} for x in ds.as_numpy_iterator()]
    assert len(ours) == len(result["instances"])
    assert ours == result["instances"]

    # Through our converter, the model's features are the records' own (padded) features.
    converted = bert_features.PretrainingFeatureConverter()(
        ds, {"inputs": LENGTH, "targets": PREDICTIONS}
    )
    spec = {
        k: tf.io.FixedLenFeature([n], tf.float32 if k == "masked_lm_weights" else tf.int64)
        for k, n in (
            ("input_ids", LENGTH),
            ("input_mask", LENGTH),
            ("segment_ids", LENGTH),
            ("masked_lm_positions", PREDICTIONS),
            ("masked_lm_ids", PREDICTIONS),
            ("masked_lm_weights", PREDICTIONS),
            ("next_sentence_labels", 1),
        )
    }
    raw = tf.data.TFRecordDataset(records).map(lambda r: tf.io.parse_single_example(r, spec))
    for mine, theirs in zip(converted.as_numpy_iterator(), raw.as_numpy_iterator()):
        for key, value in theirs.items():
            np.testing.assert_array_equal(np.reshape(mine[key], -1), value, err_msg=key)


def test_registered_tasks_read_the_reference_formats(reference):
    """`bert_tfrecord_pretraining` gives the reference's instances (in file order), and
    `bert_sentence_corpus_pretraining` pairs from the reference's corpus file."""
    import gin

    from t5x_like.tasks import bert  # noqa: F401 - registers the tasks

    result, corpus, vocab_path, documents = reference
    records = os.path.join(os.path.dirname(corpus), "reference.tfrecord")
    gin.bind_parameter("bert_vocab_path.path", vocab_path)
    gin.bind_parameter("bert_tfrecords.train_files", records)
    gin.bind_parameter("bert_sentence_corpus.train_files", corpus)
    lengths = {"inputs": LENGTH, "targets": PREDICTIONS}
    ds = seqio.get_mixture_or_task("bert_tfrecord_pretraining").get_dataset(
        lengths, split="train", shuffle=False, num_epochs=1
    )
    ours = [{k: np.asarray(v).tolist() for k, v in x.items()} for x in ds.as_numpy_iterator()]
    assert ours == result["instances"]
    ds = seqio.get_mixture_or_task("bert_sentence_corpus_pretraining").get_dataset(
        lengths, split="train", shuffle=False, num_epochs=1, seed=0
    )
    pairs = [{k: np.asarray(v).tolist() for k, v in x.items()} for x in ds.as_numpy_iterator()]
    assert 0.5 * len(result["instances"]) / 3 < len(pairs) < 2 * len(result["instances"]) / 3
    with pytest.raises(ValueError, match="bert_tfrecords.validation_files"):
        seqio.get_mixture_or_task("bert_tfrecord_pretraining").get_dataset(
            lengths, split="validation", shuffle=False, num_epochs=1
        )


def test_tfrecord_records_longer_than_the_run_fail(reference):
    result, corpus, vocab_path, documents = reference
    from t5x_like.tasks import bert

    records = os.path.join(os.path.dirname(corpus), "reference.tfrecord")
    ds = bp.from_reference_records(
        bert.tfrecord_source(train_files=records).get_dataset("train", shuffle=False),
        {"inputs": 16, "targets": PREDICTIONS},
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature length inputs=16"):
        list(ds.as_numpy_iterator())


@pytest.mark.slow
def test_large_sample_statistics(tmp_path):
    """1,000 documents and the reference's dupe_factor of 10: ~25,000 instances a side."""
    result, corpus, vocab_path, documents = _oracle(tmp_path, 1000, 10, seed=1)
    vocab = _vocab(len(documents))
    theirs = _statistics(result["instances"], vocab, _single(documents))
    _assert_same_statistics(
        _statistics(_ours(corpus, vocab_path, passes=10), vocab, _single(documents)), theirs
    )
    _assert_same_statistics(
        _statistics(_ours(corpus, vocab_path, dupe_factor=10), vocab, _single(documents)), theirs
    )


def test_a_reference_format_corpus_draws_b_from_all_of_it(reference, monkeypatch):
    """create_pretraining_data.py draws a random B from every document of its input: the
    bert_sentence_corpus tasks make their group the whole corpus (counted once), and 'all' does
    the same for any task; a group that is no number is refused by name."""
    import gin

    from t5x_like.tasks import bert

    result, corpus, vocab_path, documents = reference
    source = bert.sentence_corpus_source(train_files=corpus)
    assert bert.corpus_documents(source) == len(documents)
    groups = []
    real = bp.pretraining_pairs
    monkeypatch.setattr(
        bp,
        "pretraining_pairs",
        lambda vocab, group, **kw: groups.append(group) or real(vocab, group, **kw),
    )
    gin.bind_parameter("bert_vocab_path.path", vocab_path)
    gin.bind_parameter("bert_sentence_corpus.train_files", corpus)
    lengths = {"inputs": LENGTH, "targets": PREDICTIONS}
    task = seqio.get_mixture_or_task("bert_sentence_corpus_pretraining")
    task.get_dataset(lengths, split="train", shuffle=False, num_epochs=1, seed=0)
    gin.bind_parameter("bert_pretraining_options.documents_per_group", 7)
    task.get_dataset(lengths, split="train", shuffle=False, num_epochs=1, seed=0)
    assert groups == [len(documents), 7]
    gin.bind_parameter("bert_pretraining_options.documents_per_group", "some")
    with pytest.raises(Exception, match="documents_per_group='some'"):
        task.get_dataset(lengths, split="train", shuffle=False, num_epochs=1, seed=0)
