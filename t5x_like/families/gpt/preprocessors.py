"""GPT-1's task input transformations (section 3.3, Figure 1): every task becomes token
sequences framed by the learned start, delimiter and extract tokens.

  classification   [start] text [extract]
  entailment       [start] premise [delim] hypothesis [extract]
  similarity       both orderings: [start] a [delim] b [extract] and [start] b [delim] a [extract]
  multiple choice  per candidate:  [start] context [delim] answer [extract]

The special tokens are the embedding rows right after the model's vocabulary
(`GPTConfig.vocab_size` + 0, 1, 2; the model adds them with `num_special_tokens = 3`), read when
the dataset is built. A pair that does not fit is cut as BERT's reference cuts it (the longer
text loses its last token first). Output: `inputs` (length,) or (sequences, length), zero
`segment_ids` of the same shape (the converters BERT uses expect them), and `label`.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import seqio
import tensorflow as tf

from t5x_like.families.bert.preprocessors import truncated_pair_lengths

NUM_SPECIAL_TOKENS = 3
TRANSFORMS = ("classification", "entailment", "similarity", "choices")


def special_token_ids() -> tuple[int, int, int]:
    """(start, delimiter, extract): the rows after the gin-bound model's vocabulary."""
    from t5x_like.families.gpt.network import GPTConfig

    base = GPTConfig().vocab_size
    return base, base + 1, base + 2


def frame(a: tf.Tensor, b: tf.Tensor | None, length: int, ids: tuple[int, int, int]) -> tf.Tensor:
    """`[start] a [extract]` or `[start] a [delim] b [extract]`, cut to `length`."""
    start, delim, extract = (tf.constant([i], tf.int32) for i in ids)
    if b is None:
        return tf.concat([start, a[: length - 2], extract], 0)
    len_a, len_b = truncated_pair_lengths(tf.size(a), tf.size(b), length - 3)
    return tf.concat([start, a[:len_a], delim, b[:len_b], extract], 0)


def padded_frame(
    a: tf.Tensor, b: tf.Tensor | None, length: int, ids: tuple[int, int, int]
) -> tf.Tensor:
    """`frame` padded with 0 to exactly `length` (rows of one example stack together)."""
    row = frame(a, b, length, ids)
    return tf.pad(row, [[0, length - tf.size(row)]])


def transform(
    kind: str,
    text_keys: Sequence[str],
    label_key: str = "label",
    label_map: Callable[[tf.Tensor], tf.Tensor] | None = None,
) -> Callable:
    """A seqio preprocessor applying one of GPT-1's `TRANSFORMS`, tokenizing with the task's
    `inputs` vocabulary. For 'choices', `text_keys` is (context key, candidates key) with the
    candidates a string list per example."""
    if kind not in TRANSFORMS:
        raise ValueError(f"Unknown GPT input transformation {kind!r}; choose one of {TRANSFORMS}.")

    def preprocess(
        ds: tf.data.Dataset,
        sequence_length: Mapping[str, int],
        output_features: Mapping[str, seqio.Feature],
    ) -> tf.data.Dataset:
        length = sequence_length["inputs"]
        vocabulary = output_features["inputs"].vocabulary
        ids = special_token_ids()

        def encode(text):
            return tf.cast(vocabulary.encode_tf(text), tf.int32)

        def one(ex):
            label = ex[label_key] if label_map is None else label_map(ex[label_key])
            if kind == "classification":
                inputs = frame(encode(ex[text_keys[0]]), None, length, ids)
            elif kind == "entailment":
                inputs = frame(encode(ex[text_keys[0]]), encode(ex[text_keys[1]]), length, ids)
            elif kind == "similarity":
                a, b = encode(ex[text_keys[0]]), encode(ex[text_keys[1]])
                inputs = tf.stack(
                    [padded_frame(a, b, length, ids), padded_frame(b, a, length, ids)]
                )
            else:
                context = encode(ex[text_keys[0]])
                inputs = tf.map_fn(
                    lambda candidate: padded_frame(context, encode(candidate), length, ids),
                    ex[text_keys[1]],
                    fn_output_signature=tf.TensorSpec([length], tf.int32),
                )
            return {
                "inputs": inputs,
                "segment_ids": tf.zeros_like(inputs),
                "label": tf.cast(label, tf.float32),
            }

        return ds.map(one, num_parallel_calls=tf.data.AUTOTUNE)

    return preprocess


def race_questions(ds: tf.data.Dataset) -> tf.data.Dataset:
    """TFDS RACE holds one article with several questions: one example per question, context
    = article + question, candidates = its four options, label = the answer letter's index."""

    def split(ex):
        return tf.data.Dataset.from_tensor_slices(
            {
                "context": tf.strings.join(
                    [tf.fill(tf.shape(ex["questions"]), ex["article"]), ex["questions"]],
                    separator=" ",
                ),
                "candidates": ex["options"].to_tensor()
                if isinstance(ex["options"], tf.RaggedTensor)
                else ex["options"],
                "label": tf.cast(
                    tf.strings.unicode_decode(ex["answers"], "UTF-8").to_tensor()[:, 0] - ord("A"),
                    tf.int32,
                ),
            }
        )

    return ds.flat_map(split)
