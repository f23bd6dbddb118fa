"""The unsupervised objectives compared in section 3.3 of the T5 paper, as seqio preprocessors.

Each objective is a noise mask plus two span functions (what the inputs and the targets keep),
combined by `preprocessors.denoise`, exactly the decomposition of the t5 library, so the same
pieces rebuild every row of the paper's Table 3 ("Thank you for inviting me to your party last
week ."):

  objective            noise mask        inputs                                targets
  prefix_lm            -                 first part                            the rest
  bert_style           i.i.d. 15%        90% mask token, 10% random token      original text
  deshuffling          -                 tokens shuffled                       original text
  mass_style           i.i.d. 15%        mask token                            original text
  iid_replace_spans    i.i.d. 15%        each noise run -> a unique sentinel   the runs, each after its sentinel
  iid_drop_tokens      i.i.d. 15%        noise tokens dropped                  the dropped tokens
  random_spans         random spans      like iid_replace_spans                like iid_replace_spans

"Mask token" is the first sentinel (`<extra_id_0>`, the top of the vocabulary), as in t5.
`unsupervised_objective` is the one preprocessor a task names; its gin-able arguments choose the
objective, the corruption rate (10/15/25/50%) and the mean span length (2/3/5/10).
"""

from __future__ import annotations

import functools
from typing import Mapping

import seqio
import tensorflow as tf

from t5x_like import preprocessors

# Random replacement tokens skip pad (0), EOS (1) and UNK (2): a pad inside a sequence would
# read as padding.
FIRST_ORDINARY_ID = 3
OBJECTIVES = ("prefix_lm", "bert_style", "deshuffling", "mass_style", "iid_replace_spans",
              "iid_drop_tokens", "random_spans")


# ----------------------------------------------------------------------- noise masks
def iid_noise_mask(length: tf.Tensor, noise_density: float, seeds: tf.Tensor) -> tf.Tensor:
    """Each position is noise independently with probability `noise_density`."""
    return tf.random.stateless_uniform([length], seed=seeds[0]) < noise_density


# ----------------------------------------------------------------------- span functions
def replace_noise_tokens(tokens: tf.Tensor, noise_mask: tf.Tensor, use_random: tf.Tensor,
                         random_tokens: tf.Tensor, mask_id: int) -> tf.Tensor:
    """Noise positions become `mask_id`, or `random_tokens` where `use_random` is set."""
    replacement = tf.where(use_random, random_tokens, tf.cast(mask_id, tokens.dtype))
    return tf.where(noise_mask, replacement, tokens)


def noise_token_to_sentinel(tokens: tf.Tensor, noise_mask: tf.Tensor,
                            vocabulary: seqio.Vocabulary,
                            seed: tf.Tensor | None = None) -> tf.Tensor:
    """MASS-style: every noise token becomes the mask token (no random swaps)."""
    del seed
    mask_id = preprocessors.sentinel_id(vocabulary)
    return replace_noise_tokens(tokens, noise_mask, tf.zeros_like(noise_mask),
                                tf.zeros_like(tokens), mask_id)


def noise_token_to_random_token_or_sentinel(tokens: tf.Tensor, noise_mask: tf.Tensor,
                                            vocabulary: seqio.Vocabulary, seed: tf.Tensor,
                                            random_prob: float = 0.1) -> tf.Tensor:
    """BERT-style as the paper adapts it: of the noise tokens, 90% become the mask token and
    10% a token drawn uniformly from the ordinary vocabulary (no pad/EOS/UNK, no
    sentinels)."""
    seeds = tf.random.experimental.stateless_split(seed, 2)
    shape = tf.shape(tokens)
    use_random = tf.random.stateless_uniform(shape, seed=seeds[0]) < random_prob
    random_tokens = tf.random.stateless_uniform(
        shape, seed=seeds[1], minval=FIRST_ORDINARY_ID, maxval=vocabulary.vocab_size - vocabulary.extra_ids,
        dtype=tokens.dtype)
    return replace_noise_tokens(tokens, noise_mask, use_random, random_tokens,
                                preprocessors.sentinel_id(vocabulary))


def drop_noise_tokens(tokens: tf.Tensor, noise_mask: tf.Tensor,
                      vocabulary: seqio.Vocabulary, seed: tf.Tensor | None = None) -> tf.Tensor:
    del vocabulary, seed
    return tf.boolean_mask(tokens, tf.logical_not(noise_mask))


def drop_nonnoise_tokens(tokens: tf.Tensor, noise_mask: tf.Tensor,
                         vocabulary: seqio.Vocabulary,
                         seed: tf.Tensor | None = None) -> tf.Tensor:
    del vocabulary, seed
    return tf.boolean_mask(tokens, noise_mask)


def permute_tokens(tokens: tf.Tensor, noise_mask: tf.Tensor, vocabulary: seqio.Vocabulary,
                   seed: tf.Tensor) -> tf.Tensor:
    """Deshuffling's input: all tokens in a random order (the mask is unused)."""
    del noise_mask, vocabulary
    return seqio.stateless_shuffle(tokens, seed)


def split_at(tokens: tf.Tensor, split: tf.Tensor) -> dict[str, tf.Tensor]:
    """Prefix LM: tokens before `split` are the inputs, the rest the targets."""
    return {"inputs": tokens[:split], "targets": tokens[split:]}


def random_split_point(length: tf.Tensor, max_inputs: int, max_targets: int,
                       seed: tf.Tensor) -> tf.Tensor:
    """A uniform split in [1, length-1] that leaves at most `max_inputs` tokens before it and
    `max_targets` after it (both at least one token)."""
    low = tf.maximum(1, length - max_targets)
    high = tf.maximum(low, tf.minimum(length - 1, max_inputs))
    return tf.random.stateless_uniform([], seed=seed, minval=low, maxval=high + 1,
                                       dtype=tf.int32)


# ----------------------------------------------------------------------- preprocessors
def prefix_lm(dataset: tf.data.Dataset, sequence_length: Mapping[str, int]) -> tf.data.Dataset:
    """Split each text (tokenized `targets`) in two at a random point."""
    max_inputs, max_targets = sequence_length["inputs"] - 1, sequence_length["targets"] - 1

    @seqio.map_over_dataset(num_seeds=1)
    def split(features, seed):
        tokens = features["targets"]
        return split_at(tokens, random_split_point(tf.size(tokens), max_inputs, max_targets,
                                                   seed))

    dataset = dataset.filter(lambda x: tf.size(x["targets"]) > 1)
    return split(dataset)


def _objective_fns(objective: str, mean_noise_span_length: float):
    """(noise mask, inputs fn, targets fn or None for the original text) of an objective."""
    random_spans = functools.partial(preprocessors.random_spans_noise_mask,
                                     mean_noise_span_length=mean_noise_span_length)
    unique = (preprocessors.noise_span_to_unique_sentinel,
              preprocessors.nonnoise_span_to_unique_sentinel)
    table = {
        "bert_style": (iid_noise_mask, noise_token_to_random_token_or_sentinel, None),
        "deshuffling": (iid_noise_mask, permute_tokens, None),
        "mass_style": (iid_noise_mask, noise_token_to_sentinel, None),
        "iid_replace_spans": (iid_noise_mask,) + unique,
        "iid_drop_tokens": (iid_noise_mask, drop_noise_tokens, drop_nonnoise_tokens),
        "random_spans": (random_spans,) + unique,
    }
    return table[objective]


def check_objective(objective: str) -> None:
    if objective not in OBJECTIVES:
        raise ValueError(f"Unknown objective {objective!r}; choose one of {OBJECTIVES}.")


def raw_tokens_per_example(objective: str, sequence_length: Mapping[str, int],
                           noise_density: float, mean_noise_span_length: float) -> int:
    """How many text tokens one example corrupts, so that its inputs fit
    sequence_length['inputs'] with EOS (span objectives shrink the inputs; the others keep or
    only drop tokens)."""
    if objective == "random_spans":
        return preprocessors.random_spans_helper(sequence_length["inputs"], noise_density,
                                                 mean_noise_span_length)[0]
    if objective == "prefix_lm":
        return sequence_length["inputs"] + sequence_length["targets"] - 2
    return sequence_length["inputs"] - 1


def unsupervised_objective(dataset: tf.data.Dataset, sequence_length: Mapping[str, int],
                           output_features: Mapping[str, seqio.Feature],
                           objective: str = "random_spans", noise_density: float = 0.15,
                           mean_noise_span_length: float = 3.0) -> tf.data.Dataset:
    """Any section 3.3 objective on a dataset of tokenized documents under `targets`.

    Documents are chunked and concatenated as for T5's span corruption, cut to the number of
    raw tokens that fits the inputs, then corrupted. Targets longer than
    sequence_length['targets'] are trimmed by the task's `append_eos_after_trim`.
    """
    check_objective(objective)
    if objective == "random_spans":  # t5's own pipeline, with its targets-length check
        return preprocessors.span_corruption(dataset, sequence_length, output_features,
                                             mean_noise_span_length, noise_density)
    dataset = preprocessors.select_random_chunk(dataset)
    dataset = preprocessors.reduce_concat_tokens(dataset)
    dataset = preprocessors.split_tokens(
        dataset, raw_tokens_per_example(objective, sequence_length, noise_density,
                                        mean_noise_span_length))
    if objective == "prefix_lm":
        return prefix_lm(dataset, sequence_length)
    noise_mask_fn, inputs_fn, targets_fn = _objective_fns(objective, mean_noise_span_length)
    return preprocessors.denoise(dataset, output_features, noise_density, noise_mask_fn,
                                 inputs_fn, targets_fn)
