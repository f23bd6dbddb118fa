"""seqio preprocessors that turn raw text into BERT's examples (section 3 and appendix A).

* `pretraining_pairs`: documents -> sentences -> WordPiece -> groups of documents ->
  `[CLS] A [SEP] B [SEP]` pairs with masking (`bert_data`, the reference's algorithms, run in
  a `tf.numpy_function` on each group, seeded by seqio so the stream is reproducible).
  Masks are drawn afresh each epoch by default; `dupe_factor` gives the reference's static
  masking (a fixed set of `dupe_factor` maskings, 10 in the reference).
* `from_reference_records`: the TFRecords that the reference's create_pretraining_data.py
  writes, as the same features (`bert_tfrecord_pretraining` in tasks/bert.py).
* `frame_pair`/`frame_single`: fine-tuning inputs — one or two texts tokenized, truncated as
  the reference's `_truncate_seq_pair` does, framed with [CLS]/[SEP] and segment ids, the label
  kept as a number (not text-to-text).
* `frame_choices`: SWAG-style, one framed (context, ending) pair per choice.
* `frame_squad`: question + the document-stride windows of a SQuAD context (`squad_spans`),
  with the answer's token start/end in each window ([CLS] when the window lacks it).
* `frame_tagging`: CoNLL-style words with a label each, scored on each word's first piece.
"""

from __future__ import annotations

import hashlib
from typing import Callable, Mapping, Sequence

import numpy as np
import seqio
import tensorflow as tf

from t5x_like.data.wordpiece import WordPieceVocabulary
from t5x_like.families.bert import pretraining_data as bert_data
from t5x_like.families.bert import squad_spans

# A sentence ends at . ! or ? (and any closing quote/bracket) followed by whitespace; a
# newline always ends one. Good enough for prose; the reference read one sentence per line.
_SENTENCE_END = r"""([.!?]["')\]]*)\s+"""


def split_sentences(text: tf.Tensor) -> tf.Tensor:
    """A document's non-empty sentences, in order (1-D string tensor)."""
    marked = tf.strings.regex_replace(text, _SENTENCE_END, "\\1\n")
    sentences = tf.strings.strip(tf.strings.split(marked, "\n"))
    return tf.boolean_mask(sentences, tf.strings.length(sentences) > 0)


def tokenize_sentences(vocab: WordPieceVocabulary, sentences: tf.Tensor) -> tf.RaggedTensor:
    """(sentences, pieces) WordPiece ids, sentences that tokenize to nothing dropped."""
    pieces = tf.cast(vocab.tokenizer.tokenize(sentences), tf.int32)  # BertTokenizer: 2-D
    return tf.ragged.boolean_mask(pieces, pieces.row_lengths() > 0)


def max_predictions_for(length: int) -> int:
    """The reference's max_predictions_per_seq: 20 at 128 and 80 at 512 (15% rounded up to
    a multiple of 5/32 of the length), for other lengths the same proportion."""
    return int(np.ceil(length * 5 / 32))


# The reference draws a NotNext B from every document of one run of create_pretraining_data.py
# (its input shard). A streaming pipeline holds the documents of one group at a time; a group
# this large makes B's document close to uniform over a corpus far beyond the old 64 (the
# offline task passes its whole corpus; see tasks/bert.py).
DOCUMENTS_PER_GROUP = 4096
# The reference's --random_seed default: static masking (`dupe_factor`) is seeded by it.
REFERENCE_RANDOM_SEED = 12345


def document_sentences(ex: Mapping[str, tf.Tensor], text_key: str = "text") -> tf.Tensor:
    """A document's sentences: its `sentences` feature when the source has one (the
    reference's corpus format, one sentence per line: `SentencePerLineSource` in tasks/bert.py),
    else `split_sentences` of its text."""
    if "sentences" in ex:
        sentences = tf.strings.strip(ex["sentences"])
        return tf.boolean_mask(sentences, tf.strings.length(sentences) > 0)
    return split_sentences(ex[text_key])


def pretraining_pairs(
    vocab: WordPieceVocabulary,
    documents_per_group: int | Callable[[], int] = DOCUMENTS_PER_GROUP,
    short_seq_prob: float = 0.1,
    whole_word_masking: bool = False,
    text_key: str = "text",
    dupe_factor: int | None = None,
    random_seed: int = REFERENCE_RANDOM_SEED,
    skip_single_sentence_chunks: bool = False,
) -> Callable:
    """The pretraining preprocessor: documents in, masked sentence pairs out, with features
    `inputs` (masked ids), `segment_ids`, `masked_lm_positions`, `targets` (original ids at
    those positions) and `next_sentence_labels` (0 IsNext, 1 NotNext).

    Documents are taken `documents_per_group` at a time (a number, or a function called when
    the dataset is built); a NotNext B comes from any document of the group, as the
    reference's comes from any document of its input.

    Masking is dynamic by default: each pass over the data draws new pairs and masks from
    seqio's seed (RoBERTa, Liu et al., 2019, section 4.1; a deliberate deviation from the
    reference, which wrote a fixed set). `dupe_factor=k` is the reference's static masking:
    each group is made into pairs k times, each copy masked once, seeded by `random_seed` and
    the group's content only, so a group that comes again (the whole corpus, read again)
    gives the same k copies every epoch, as training on the reference's TFRecords does."""

    def preprocess(ds: tf.data.Dataset, sequence_length: Mapping[str, int]) -> tf.data.Dataset:
        length = sequence_length["inputs"]
        predictions = sequence_length.get("targets") or max_predictions_for(length)
        group = documents_per_group() if callable(documents_per_group) else documents_per_group
        vocab.tokenizer  # noqa: B018 - read (or build) the vocabulary now, outside tf.data
        ds = ds.map(
            lambda ex: tokenize_sentences(vocab, document_sentences(ex, text_key)),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
        ds = ds.filter(lambda sentences: sentences.nrows() > 0)
        ds = ds.ragged_batch(int(group))
        make = _instance_maker(
            vocab,
            length,
            predictions,
            short_seq_prob,
            whole_word_masking,
            dupe_factor,
            random_seed,
            skip_single_sentence_chunks,
        )

        @seqio.map_over_dataset(num_seeds=1)
        def to_instances(group, seed):
            outer, inner = group.nested_row_splits
            arrays = tf.numpy_function(
                make, [group.flat_values, inner, outer, seed], [tf.int32] * 5, stateful=False
            )
            arrays[0].set_shape([None, length])
            arrays[1].set_shape([None, length])
            arrays[2].set_shape([None, predictions])
            arrays[3].set_shape([None, predictions])
            arrays[4].set_shape([None])
            keys = (
                "inputs",
                "segment_ids",
                "masked_lm_positions",
                "targets",
                "next_sentence_labels",
            )
            return dict(zip(keys, arrays))

        return to_instances(ds).unbatch().map(_strip_padding, num_parallel_calls=tf.data.AUTOTUNE)

    return preprocess


def _strip_padding(ex: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """Variable-length features as seqio tasks hold them (the converter pads again)."""
    predicted = tf.reduce_sum(tf.cast(ex["masked_lm_positions"] > 0, tf.int32))
    # The row ends at its final [SEP] (never masked), the last non-zero id.
    real = tf.reduce_max(tf.where(ex["inputs"] != 0)) + 1
    return {
        **ex,
        "inputs": ex["inputs"][:real],
        "segment_ids": ex["segment_ids"][:real],
        "masked_lm_positions": ex["masked_lm_positions"][:predicted],
        "targets": ex["targets"][:predicted],
    }


def _group_documents(
    flat: np.ndarray, sentence_splits: np.ndarray, document_splits: np.ndarray
) -> list[list[list[int]]]:
    tokens = flat.tolist()
    return [
        [
            tokens[sentence_splits[s] : sentence_splits[s + 1]]
            for s in range(document_splits[d], document_splits[d + 1])
        ]
        for d in range(len(document_splits) - 1)
    ]


def _content_ordered(documents: list[list[list[int]]]) -> tuple[list[list[list[int]]], bytes]:
    """The documents in an order fixed by their content, and a digest of the group, so static
    masking does not depend on the order (or the epoch) in which the group was read."""

    def digest(document: list[list[int]]) -> bytes:
        ids = [t for s in document for t in s] + [-1] + [len(s) for s in document]
        return hashlib.blake2b(np.asarray(ids, np.int64).tobytes(), digest_size=16).digest()

    digests = [digest(doc) for doc in documents]
    order = sorted(range(len(documents)), key=digests.__getitem__)
    group = hashlib.blake2b(b"".join(digests[i] for i in order), digest_size=16).digest()
    return [documents[i] for i in order], group


def _instance_maker(
    vocab: WordPieceVocabulary,
    length: int,
    predictions: int,
    short_seq_prob: float,
    whole_word: bool,
    dupe_factor: int | None = None,
    random_seed: int = REFERENCE_RANDOM_SEED,
    skip_single_sentence_chunks: bool = False,
) -> Callable:
    cls_id, sep_id, mask_id, vocab_size = (
        vocab.cls_id,
        vocab.sep_id,
        vocab.mask_id,
        vocab.vocab_size,
    )
    pieces = vocab.pieces if whole_word else None

    def copies(documents: list[list[list[int]]], seed: np.ndarray):
        """(documents, random generator) of each copy of the group to make into pairs."""
        if dupe_factor is None:
            return [(documents, np.random.default_rng([int(s) & 0xFFFFFFFF for s in seed]))]
        documents, digest = _content_ordered(documents)
        words = np.frombuffer(digest, np.uint32).tolist()
        return [
            (documents, np.random.default_rng([random_seed, k] + words)) for k in range(dupe_factor)
        ]

    def make(
        flat: np.ndarray, sentence_splits: np.ndarray, document_splits: np.ndarray, seed: np.ndarray
    ) -> list[np.ndarray]:
        rows = []
        for documents, rng in copies(
            _group_documents(flat, sentence_splits, document_splits), seed
        ):
            for instance in bert_data.sentence_pair_instances(
                documents, length, cls_id, sep_id, rng, short_seq_prob, skip_single_sentence_chunks
            ):
                rows.append(
                    (
                        instance,
                        bert_data.mask_tokens(
                            instance.tokens,
                            (cls_id, sep_id),
                            mask_id,
                            vocab_size,
                            predictions,
                            rng,
                            pieces=pieces,
                            whole_word=whole_word,
                        ),
                    )
                )
        n = len(rows)
        tokens = np.zeros((n, length), np.int32)
        segments = np.zeros((n, length), np.int32)
        positions = np.zeros((n, predictions), np.int32)
        targets = np.zeros((n, predictions), np.int32)
        labels = np.zeros((n,), np.int32)
        for i, (instance, (masked, chosen, original)) in enumerate(rows):
            tokens[i, : len(masked)] = masked
            segments[i, : len(masked)] = instance.segment_ids
            positions[i, : len(chosen)] = chosen
            targets[i, : len(chosen)] = original
            labels[i] = bert_data.NOT_NEXT if instance.is_random_next else bert_data.IS_NEXT
        return [tokens, segments, positions, targets, labels]

    return make


# ------------------------------------------------------------------- the reference's TFRecords
REFERENCE_RECORD_FEATURES = (
    "input_ids",
    "input_mask",
    "segment_ids",
    "masked_lm_positions",
    "masked_lm_ids",
    "masked_lm_weights",
    "next_sentence_labels",
)


def reference_record_features() -> dict[str, tf.io.RaggedFeature]:
    """How to parse a tf.train.Example that the reference's create_pretraining_data.py wrote
    (`write_instance_to_example_files`): every feature a list, of any length."""
    return {
        k: tf.io.RaggedFeature(tf.float32 if k == "masked_lm_weights" else tf.int64)
        for k in REFERENCE_RECORD_FEATURES
    }


def from_reference_records(
    ds: tf.data.Dataset, sequence_length: Mapping[str, int] | None = None
) -> tf.data.Dataset:
    """The reference's pretraining records as our pretraining task's features: its padding
    dropped (`input_mask`, `masked_lm_weights`), `input_ids` -> `inputs`, `masked_lm_ids` ->
    `targets`; `segment_ids`, `masked_lm_positions` and `next_sentence_labels` as they are.
    A record longer than the run's feature lengths fails the pipeline (never cut silently)."""

    def convert(ex):
        real = tf.reduce_sum(tf.cast(ex["input_mask"], tf.int32))
        predicted = tf.reduce_sum(tf.cast(ex["masked_lm_weights"] > 0, tf.int32))
        checks = []
        if sequence_length:
            for key, n in (("inputs", real), ("targets", predicted)):
                if sequence_length.get(key):
                    checks.append(
                        tf.debugging.assert_less_equal(
                            n,
                            sequence_length[key],
                            message=(
                                f"A record of the reference has more {key} than the task "
                                f"feature length {key}={sequence_length[key]}: write the records "
                                "with max_seq_length / max_predictions_per_seq at most the run's "
                                "lengths, or raise the lengths."
                            ),
                        )
                    )
        with tf.control_dependencies(checks):
            as_int = {
                k: tf.cast(ex[k], tf.int32)
                for k in REFERENCE_RECORD_FEATURES
                if k != "masked_lm_weights"
            }
            return {
                "inputs": as_int["input_ids"][:real],
                "segment_ids": as_int["segment_ids"][:real],
                "masked_lm_positions": as_int["masked_lm_positions"][:predicted],
                "targets": as_int["masked_lm_ids"][:predicted],
                "next_sentence_labels": tf.reshape(as_int["next_sentence_labels"], []),
            }

    return ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)


# ------------------------------------------------------------------------------ fine-tuning
def truncated_pair_lengths(
    len_a: tf.Tensor, len_b: tf.Tensor, budget: int
) -> tuple[tf.Tensor, tf.Tensor]:
    """Lengths after the reference's `_truncate_seq_pair` (drop the last token of the longer
    text, B on ties, until the pair fits `budget`), in closed form: if the shorter text fits in
    half the budget only the longer is cut, to the rest; otherwise A keeps ceil(budget / 2)
    and B floor(budget / 2)."""
    fits = len_a + len_b <= budget
    shorter_fits_half = 2 * tf.minimum(len_a, len_b) <= budget
    a_shorter = len_a <= len_b
    cut_a = tf.where(
        shorter_fits_half, tf.where(a_shorter, len_a, budget - len_b), (budget + 1) // 2
    )
    cut_b = tf.where(shorter_fits_half, tf.where(a_shorter, budget - len_a, len_b), budget // 2)
    return tf.where(fits, len_a, cut_a), tf.where(fits, len_b, cut_b)


def _tokens(vocab: WordPieceVocabulary, text: tf.Tensor) -> tf.Tensor:
    return tf.cast(vocab.tokenizer.tokenize(tf.reshape(text, [1])).flat_values, tf.int32)


def _frame(
    vocab: WordPieceVocabulary, a: tf.Tensor, b: tf.Tensor | None, length: int
) -> tuple[tf.Tensor, tf.Tensor]:
    """`[CLS] a [SEP] (b [SEP])` ids and segment ids, truncated to `length`."""
    cls = tf.constant([vocab.cls_id], tf.int32)
    sep = tf.constant([vocab.sep_id], tf.int32)
    if b is None:
        a = a[: length - 2]
        ids = tf.concat([cls, a, sep], 0)
        return ids, tf.zeros_like(ids)

    def pair():
        len_a, len_b = truncated_pair_lengths(tf.size(a), tf.size(b), length - 3)
        first = tf.concat([cls, a[:len_a], sep], 0)
        second = tf.concat([b[:len_b], sep], 0)
        return (
            tf.concat([first, second], 0),
            tf.concat([tf.zeros_like(first), tf.ones_like(second)], 0),
        )

    # An empty b frames a single sentence, as the reference's `if tokens_b:`
    # (run_classifier.convert_single_example).
    return tf.cond(tf.size(b) > 0, pair, lambda: _frame(vocab, a, None, length))


def frame_pair(
    vocab: WordPieceVocabulary,
    text_keys: Sequence[str],
    label_key: str = "label",
    label_map: Callable[[tf.Tensor], tf.Tensor] | None = None,
) -> Callable:
    """Sentence or sentence-pair classification/regression examples: `inputs`, `segment_ids`,
    `label` (float32: a class id or a score)."""

    def preprocess(ds: tf.data.Dataset, sequence_length: Mapping[str, int]) -> tf.data.Dataset:
        length = sequence_length["inputs"]
        vocab.tokenizer  # noqa: B018 - read (or build) the vocabulary now, outside tf.data

        def frame(ex):
            a = _tokens(vocab, ex[text_keys[0]])
            b = _tokens(vocab, ex[text_keys[1]]) if len(text_keys) > 1 else None
            ids, segments = _frame(vocab, a, b, length)
            label = ex[label_key] if label_map is None else label_map(ex[label_key])
            return {"inputs": ids, "segment_ids": segments, "label": tf.cast(label, tf.float32)}

        return ds.map(frame, num_parallel_calls=tf.data.AUTOTUNE)

    return preprocess


def frame_choices(
    vocab: WordPieceVocabulary, context_key: str, endings_key: str, label_key: str = "label"
) -> Callable:
    """SWAG-style: `[CLS] context [SEP] ending [SEP]` for every ending, stacked
    (choices, length) and padded with [PAD]; `label` is the right ending's index."""

    def preprocess(ds: tf.data.Dataset, sequence_length: Mapping[str, int]) -> tf.data.Dataset:
        length = sequence_length["inputs"]
        vocab.tokenizer  # noqa: B018 - read (or build) the vocabulary now, outside tf.data

        def frame(ex):
            context = _tokens(vocab, ex[context_key])

            def one(ending):
                ids, segments = _frame(vocab, context, _tokens(vocab, ending), length)
                pad = [[0, length - tf.size(ids)]]
                return tf.pad(ids, pad), tf.pad(segments, pad)

            ids, segments = tf.map_fn(
                one,
                ex[endings_key],
                fn_output_signature=(
                    tf.TensorSpec([length], tf.int32),
                    tf.TensorSpec([length], tf.int32),
                ),
            )
            return {
                "inputs": ids,
                "segment_ids": segments,
                "label": tf.cast(ex[label_key], tf.float32),
            }

        return ds.map(frame, num_parallel_calls=tf.data.AUTOTUNE)

    return preprocess


def frame_tagging(
    vocab: WordPieceVocabulary, words_key: str = "tokens", tags_key: str = "ner"
) -> Callable:
    """Words and their tags -> `[CLS] pieces [SEP]`, the tag on each word's first piece
    (`label_weights` 1) and nothing scored on continuation pieces, [CLS] or [SEP]."""

    def preprocess(ds: tf.data.Dataset, sequence_length: Mapping[str, int]) -> tf.data.Dataset:
        length = sequence_length["inputs"]
        vocab.tokenizer  # noqa: B018 - read (or build) the vocabulary now, outside tf.data

        def frame(ex):
            pieces = tf.cast(vocab.tokenizer.tokenize(ex[words_key]), tf.int32)  # (words, pieces)
            first = tf.ones_like(pieces[:, :1])
            rest = tf.zeros_like(pieces[:, 1:])
            starts = tf.concat([first, rest], axis=1).flat_values
            tags = tf.repeat(tf.cast(ex[tags_key], tf.int32), pieces.row_lengths())
            ids = pieces.flat_values[: length - 2]
            starts, tags = starts[: length - 2], tags[: length - 2]
            edge = tf.zeros([1], tf.int32)
            return {
                "inputs": tf.concat([[vocab.cls_id], ids, [vocab.sep_id]], 0),
                "segment_ids": tf.zeros([tf.size(ids) + 2], tf.int32),
                "labels": tf.concat([edge, tags, edge], 0),
                "label_weights": tf.concat([edge, starts, edge], 0),
            }

        return ds.map(frame, num_parallel_calls=tf.data.AUTOTUNE)

    return preprocess


def squad_features(
    vocab: WordPieceVocabulary,
    context: str,
    question: str,
    answer: tuple[str, int] | None,
    max_seq_length: int,
    doc_stride: int = 128,
    max_query_length: int = 64,
) -> tuple[list[str], list[squad_spans.Feature]]:
    """The context's words and the document-stride features of one SQuAD example (`answer`:
    (text, character offset), or None for an unanswerable v2.0 question). A training answer
    whose text the context's words do not hold at its offset gives no features, as the
    reference skips it (run_squad.read_squad_examples)."""
    words, char_to_word = squad_spans.whitespace_words(context)
    answer_words = answer_ids = None
    if answer is not None:
        answer_words = squad_spans.answer_word_span(char_to_word, answer[1], answer[0])
        if not squad_spans.answer_recoverable(words, answer_words, answer[0]):
            return words, []  # the reference's read_squad_examples skips such an example
        answer_ids = vocab.encode(answer[0])
    word_pieces = [vocab.encode(w) for w in words]
    return words, squad_spans.featurize(
        vocab.encode(question),
        word_pieces,
        max_seq_length,
        doc_stride,
        vocab.cls_id,
        vocab.sep_id,
        answer_words,
        max_query_length,
        answer_ids,
    )


def frame_squad(
    vocab: WordPieceVocabulary, doc_stride: int = 128, max_query_length: int = 64
) -> Callable:
    """SQuAD training examples -> one example per document-stride window (`squad_spans`),
    with the first answer's `start_position`/`end_position` ([CLS] = 0 when the window lacks
    it, or for an unanswerable v2.0 question)."""

    def preprocess(ds: tf.data.Dataset, sequence_length: Mapping[str, int]) -> tf.data.Dataset:
        length = sequence_length["inputs"]
        vocab.tokenizer  # noqa: B018 - read (or build) the vocabulary now, outside tf.data

        def make(context, question, answer_texts, answer_starts):
            answer = (
                (answer_texts[0].decode(), int(answer_starts[0])) if len(answer_texts) else None
            )
            _, features = squad_features(
                vocab,
                context.decode(),
                question.decode(),
                answer,
                length,
                doc_stride,
                max_query_length,
            )
            rows = np.zeros((len(features), length), np.int32)
            segments = np.zeros((len(features), length), np.int32)
            for i, f in enumerate(features):
                rows[i, : len(f.input_ids)] = f.input_ids
                segments[i, : len(f.segment_ids)] = f.segment_ids
            spans = np.asarray(
                [(f.start_position, f.end_position) for f in features], np.int32
            ).reshape(-1, 2)
            return rows, segments, spans

        def frame(ex):
            rows, segments, spans = tf.numpy_function(
                make,
                [
                    ex["context"],
                    ex["question"],
                    ex["answers"]["text"],
                    ex["answers"]["answer_start"],
                ],
                [tf.int32] * 3,
                stateful=False,
            )
            rows.set_shape([None, length])
            segments.set_shape([None, length])
            spans.set_shape([None, 2])
            return {
                "inputs": rows,
                "segment_ids": segments,
                "start_position": spans[:, 0],
                "end_position": spans[:, 1],
            }

        return (
            ds.map(frame, num_parallel_calls=tf.data.AUTOTUNE)
            .unbatch()
            .map(_strip_row_padding, num_parallel_calls=tf.data.AUTOTUNE)
        )

    return preprocess


def _strip_row_padding(ex: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    real = tf.reduce_sum(tf.cast(ex["inputs"] != 0, tf.int32))
    return {**ex, "inputs": ex["inputs"][:real], "segment_ids": ex["segment_ids"][:real]}
