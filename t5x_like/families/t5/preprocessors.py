"""seqio preprocessors for T5's unsupervised objective (span corruption, T5 paper section 3.1.4).

These follow the T5 library's definitions (t5.data.preprocessors, t5 0.9.4) step for step, down
to how each step draws seqio's per-call seeds, so that the same source and seed give the same
examples as the reference task (tests/test_reference_objectives.py checks every objective):

    select_random_chunk -> reduce_concat_tokens -> split_tokens(568) -> denoise(random spans)

and the two language-modelling pipelines: `language_model` (`objectives/lm.gin`, Table 2's LM
objective) and `full_language_model` (`full_lm`, EOS at each document's end).

Randomness comes from seqio's per-call seeds (`seqio.map_over_dataset(num_seeds=...)`): each
seeded step takes the next seed from `seqio.utils.map_seed_manager`, so a pipeline built with a
fixed seed is reproducible, and one that consumes seeds in another order is a different stream.
"""

from __future__ import annotations

import functools
from typing import Callable, Mapping

import seqio
import tensorflow as tf

Features = Mapping[str, tf.Tensor]
AUTOTUNE = tf.data.AUTOTUNE


# ----------------------------------------------------------------------- length arithmetic
def random_spans_helper(
    inputs_length: int = 512,
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
    extra_tokens_per_span_inputs: int = 1,
    extra_tokens_per_span_targets: int = 1,
) -> tuple[int, int]:
    """(raw tokens to corrupt, resulting targets length) for a desired inputs length.

    Inputs hold the non-noise tokens, one sentinel per noise span and EOS; targets hold the
    noise tokens, one sentinel per span and EOS. For inputs_length 512 at 15% / mean span 3:
    568 raw tokens -> 512 inputs, 114 targets.
    """

    def lengths(tokens_length: int) -> tuple[int, int]:
        num_noise = int(round(tokens_length * noise_density))
        num_nonnoise = tokens_length - num_noise
        num_spans = int(round(num_noise / mean_noise_span_length))
        return (
            num_nonnoise + num_spans * extra_tokens_per_span_inputs + 1,
            num_noise + num_spans * extra_tokens_per_span_targets + 1,
        )

    tokens_length = inputs_length - 1
    while lengths(tokens_length + 1)[0] <= inputs_length:
        tokens_length += 1
    _, targets_length = lengths(tokens_length)
    # As in t5: at 50% noise keep targets no longer than inputs (a rounder number).
    if noise_density == 0.5 and targets_length > inputs_length:
        tokens_length -= 1
        targets_length -= 1
    return tokens_length, targets_length


# ----------------------------------------------------------------------- noise masks
def random_spans_noise_mask(
    length: tf.Tensor, noise_density: float, seeds: tf.Tensor, mean_noise_span_length: float = 3.0
) -> tf.Tensor:
    """Boolean mask of `length` with ~noise_density of positions in random spans.

    round(length * density) noise tokens are cut into round(noise / mean_span) spans; the
    non-noise tokens into as many spans; the two interleave starting with non-noise. Span
    lengths are random segmentations (uniform over compositions).
    """
    if noise_density == 0.0:
        return tf.zeros(length, tf.bool)
    orig_length = length
    length = tf.maximum(length, 2)  # avoid degenerate single-token examples

    num_noise = tf.cast(tf.round(tf.cast(length, tf.float32) * noise_density), tf.int32)
    num_noise = tf.minimum(tf.maximum(num_noise, 1), length - 1)
    num_spans = tf.cast(tf.round(tf.cast(num_noise, tf.float32) / mean_noise_span_length), tf.int32)
    num_nonnoise = length - num_noise
    # Each span needs a token of each kind (T5's code fails on short texts, e.g. 3 tokens at
    # 50% with mean span 1: two noise spans but one kept token to separate them).
    num_spans = tf.clip_by_value(num_spans, 1, tf.minimum(num_noise, num_nonnoise))

    def random_segmentation(num_items, num_segments, seed):
        first_in_segment = tf.pad(
            seqio.stateless_shuffle(
                tf.cast(tf.range(num_items - 1) < num_segments - 1, tf.int32), seed
            ),
            [[1, 0]],
        )
        segment_id = tf.cumsum(first_in_segment)
        return tf.math.segment_sum(tf.ones_like(segment_id), segment_id)

    noise_lengths = random_segmentation(num_noise, num_spans, seeds[0])
    nonnoise_lengths = random_segmentation(num_nonnoise, num_spans, seeds[1])
    interleaved = tf.reshape(tf.stack([nonnoise_lengths, noise_lengths], axis=1), [num_spans * 2])
    span_starts = tf.cumsum(interleaved)[:-1]
    span_start_indicator = tf.math.unsorted_segment_sum(
        tf.ones_like(span_starts), span_starts, length
    )
    span_num = tf.cumsum(span_start_indicator)
    is_noise = tf.equal(span_num % 2, 1)
    return is_noise[:orig_length]


def sentinel_id(vocabulary: seqio.Vocabulary) -> int:
    """The first sentinel: the top of the vocabulary (`<extra_id_0>`); later ones count down."""
    return vocabulary.vocab_size - 1


def noise_span_to_unique_sentinel(
    tokens: tf.Tensor,
    noise_mask: tf.Tensor,
    vocabulary: seqio.Vocabulary,
    seeds: tf.Tensor | None = None,
    clip_to_sentinels: bool = False,
) -> tf.Tensor:
    """Replace each run of noise tokens by one sentinel, unique within the example.

    Sentinels count down from the top of the vocabulary. Past the vocabulary's `extra_ids`
    sentinels the count goes on into ordinary pieces, as in the T5 library (i.i.d. noise at
    25-50 % over 512 tokens makes ~100-130 spans): such an id then stands for a text token too.
    `clip_to_sentinels=True` (not the reference's behaviour; objectives expose it) reuses the
    last sentinel for every further span instead, so a sentinel never reads as text.
    """
    del seeds
    prev_is_noise = tf.pad(noise_mask[:-1], [[1, 0]])
    first_noise = tf.logical_and(noise_mask, tf.logical_not(prev_is_noise))
    subsequent_noise = tf.logical_and(noise_mask, prev_is_noise)
    sentinel = sentinel_id(vocabulary) + 1 - tf.cumsum(tf.cast(first_noise, tokens.dtype))
    if clip_to_sentinels and vocabulary.extra_ids:
        sentinel = tf.maximum(sentinel, vocabulary.vocab_size - vocabulary.extra_ids)
    tokens = tf.where(first_noise, sentinel, tokens)
    return tf.boolean_mask(tokens, tf.logical_not(subsequent_noise))


def nonnoise_span_to_unique_sentinel(
    tokens: tf.Tensor,
    noise_mask: tf.Tensor,
    vocabulary: seqio.Vocabulary,
    seeds: tf.Tensor | None = None,
    clip_to_sentinels: bool = False,
) -> tf.Tensor:
    """The targets of span corruption: the dropped spans, each preceded by its sentinel."""
    return noise_span_to_unique_sentinel(
        tokens, tf.logical_not(noise_mask), vocabulary, seeds, clip_to_sentinels
    )


# ----------------------------------------------------------------------- pipeline steps
def select_random_chunk(
    dataset: tf.data.Dataset, max_length: int = 65536, feature_key: str = "targets"
) -> tf.data.Dataset:
    """Keep one random `max_length` window of each (long) document; drop empty ones.

    The window is one of the document's aligned `max_length` segments, drawn with the second
    half of a split seed, as the T5 library draws it."""

    @seqio.map_over_dataset(num_seeds=1)
    def chunk(features, seed):
        seeds = tf.unstack(tf.random.experimental.stateless_split(seed))
        tokens = features[feature_key]
        n = tf.shape(tokens)[0]
        num_segments = tf.cast(
            tf.math.ceil(tf.cast(n, tf.float32) / tf.cast(max_length, tf.float32)), tf.int32
        )
        start = max_length * tf.random.stateless_uniform(
            [], maxval=num_segments, dtype=tf.int32, seed=seeds[1]
        )
        return {feature_key: tokens[start : tf.minimum(start + max_length, n)]}

    dataset = dataset.filter(lambda x: tf.not_equal(tf.size(x[feature_key]), 0))
    return chunk(dataset)


def reduce_concat_tokens(
    dataset: tf.data.Dataset, feature_key: str = "targets", batch_size: int = 128
) -> tf.data.Dataset:
    """Concatenate `batch_size` documents at a time, so short ones don't waste a row."""
    dataset = dataset.map(lambda x: {feature_key: x[feature_key]}, num_parallel_calls=AUTOTUNE)
    dataset = dataset.padded_batch(batch_size, padded_shapes={feature_key: [-1]})

    def flatten(x):
        tokens = tf.reshape(x[feature_key], [-1])
        return {feature_key: tf.boolean_mask(tokens, tf.cast(tokens, tf.bool))}

    return dataset.map(flatten, num_parallel_calls=AUTOTUNE)


def split_tokens(
    dataset: tf.data.Dataset, max_tokens_per_segment: int, feature_key: str = "targets"
) -> tf.data.Dataset:
    """Cut each token sequence into pieces of at most `max_tokens_per_segment`.

    The split is deterministic, yet it is a seeded seqio map that takes one seed, as in the
    T5 library (whose version can also draw random segment lengths): a pipeline that skipped
    it would hand every later step a different seed than the reference's."""

    @seqio.map_over_dataset(num_seeds=1)
    def segments(x, seed):
        del seed
        tokens = x[feature_key]
        n = tf.shape(tokens)[0]
        num_segments = (n + max_tokens_per_segment - 1) // max_tokens_per_segment
        padding = num_segments * max_tokens_per_segment - n
        pieces = tf.reshape(tf.pad(tokens, [[0, padding]]), [-1, max_tokens_per_segment])
        lengths = tf.concat(
            [
                tf.repeat(max_tokens_per_segment, num_segments - 1),
                [max_tokens_per_segment - padding],
            ],
            axis=0,
        )
        return tf.data.Dataset.from_tensor_slices((pieces, lengths))

    dataset = dataset.filter(lambda x: tf.not_equal(tf.size(x[feature_key]), 0))
    return (
        segments(dataset)
        .flat_map(lambda pieces: pieces)
        .map(lambda piece, length: {feature_key: piece[:length]}, num_parallel_calls=AUTOTUNE)
    )


def language_model(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, seqio.Feature],
) -> tf.data.Dataset:
    """The T5 library's LM objective (`objectives/lm.gin`; section 3.2.3's decoder-only "LM"
    rows of Table 2): documents concatenated with no separator, cut into targets-length rows.

    Follow with `append_eos_after_trim`: each row gets an EOS (room is left for it), which
    falls wherever the cut falls, not at a document's end."""
    length = sequence_length["targets"] - int(output_features["targets"].add_eos)
    dataset = reduce_concat_tokens(select_random_chunk(dataset))
    return split_tokens(dataset, length)


def full_language_model(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, seqio.Feature],
) -> tf.data.Dataset:
    """The T5 library's `full_lm` (task `c4_v220_full_lm`): each document ends in EOS before
    documents are concatenated and cut into targets-length rows, so EOS marks real document
    ends (what a GPT-style model needs to learn to stop). No later EOS step."""
    dataset = seqio.preprocessors.append_eos(select_random_chunk(dataset), output_features)
    return split_tokens(reduce_concat_tokens(dataset), sequence_length["targets"])


NoiseMaskFn = Callable[[tf.Tensor, float, tf.Tensor], tf.Tensor]
# (tokens, noise_mask, vocabulary, seeds) -> tokens, the T5 library's protocol: `seeds` is a
# pair of seeds, used by functions that draw random tokens or orders (BERT-style, deshuffling)
# and ignored by the others.
SpanFn = Callable[..., tf.Tensor]


def denoise(
    dataset: tf.data.Dataset,
    output_features: Mapping[str, seqio.Feature],
    noise_density: float,
    noise_mask_fn: NoiseMaskFn,
    inputs_fn: SpanFn,
    targets_fn: SpanFn | None = None,
) -> tf.data.Dataset:
    """Make (inputs, targets) from `targets` tokens with a noise mask and two span functions.

    One seqio seed per example, split six ways as the T5 library splits it: two for the noise
    mask, two for the inputs function, two for the targets function."""
    vocabulary = output_features["targets"].vocabulary
    if "inputs" in output_features and output_features["inputs"].vocabulary != vocabulary:
        raise ValueError("Span corruption needs the same vocabulary for inputs and targets.")

    @seqio.map_over_dataset(num_seeds=1)
    def corrupt(features, seed):
        seeds = tf.unstack(tf.random.experimental.stateless_split(seed, 6))
        tokens = features["targets"]
        noise_mask = noise_mask_fn(tf.size(tokens), noise_density, seeds[:2])
        inputs = inputs_fn(tokens, noise_mask, vocabulary, seeds=seeds[2:4])
        targets = (
            targets_fn(tokens, noise_mask, vocabulary, seeds=seeds[4:6]) if targets_fn else tokens
        )
        return {"inputs": inputs, "targets": targets}

    return corrupt(dataset)


def span_corruption(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, seqio.Feature],
    mean_noise_span_length: float = 3.0,
    noise_density: float = 0.15,
    merge_examples_to_reduce_padding: bool = True,
) -> tf.data.Dataset:
    """T5's pretraining objective on a dataset of tokenized `targets` (whole documents).

    The raw token count per example is chosen so that, after corruption, `inputs` exactly fills
    sequence_length['inputs'] (with EOS); sequence_length['targets'] must hold the targets.
    """
    tokens_length, targets_length = random_spans_helper(
        sequence_length["inputs"], noise_density, mean_noise_span_length
    )
    if sequence_length["targets"] < targets_length:
        raise ValueError(
            f"Span corruption of inputs length {sequence_length['inputs']} at noise "
            f"{noise_density} and mean span {mean_noise_span_length} makes targets of "
            f"{targets_length} tokens, but the targets length is "
            f"{sequence_length['targets']}; set it to at least {targets_length}."
        )
    dataset = select_random_chunk(dataset)
    if merge_examples_to_reduce_padding:
        dataset = reduce_concat_tokens(dataset)
    dataset = split_tokens(dataset, tokens_length)
    return denoise(
        dataset,
        output_features,
        noise_density,
        noise_mask_fn=functools.partial(
            random_spans_noise_mask, mean_noise_span_length=mean_noise_span_length
        ),
        inputs_fn=noise_span_to_unique_sentinel,
        targets_fn=nonnoise_span_to_unique_sentinel,
    )
