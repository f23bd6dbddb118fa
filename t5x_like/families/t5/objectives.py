"""The unsupervised objectives compared in section 3.3 of the T5 paper, as seqio preprocessors.

Each objective is a noise mask plus two span functions (what the inputs and the targets keep),
combined by `preprocessors.denoise`, exactly the decomposition of the T5 library, so the same
pieces rebuild every row of the paper's Table 3 ("Thank you for inviting me to your party last
week ."):

  objective          noise mask           inputs                            targets
  prefix_lm          random prefix (50%)  the prefix                        the rest
  bert_style         i.i.d. 15%           90% mask token, 10% random token  original text
  deshuffling        every token (100%)   tokens shuffled                   original text
  mass_style         i.i.d. 15%           mask token                        original text
  iid_replace_spans  i.i.d. 15%           each noise run -> a sentinel      runs after sentinels
  iid_drop_tokens    i.i.d. 15%           noise tokens dropped              the dropped tokens
  random_spans       random spans         like iid_replace_spans            like iid_replace_spans

"Mask token" is the first sentinel (`<extra_id_0>`, the top of the vocabulary), as in t5.
`unsupervised_objective` is the one preprocessor a task names; its gin-able arguments choose the
objective, the corruption rate (10/15/25/50%) and the mean span length (2/3/5/10). Each builds
the pipeline of the T5 library's objective gin file (t5/models/gin/objectives/*.gin, t5 0.9.4):
prefix LM and deshuffling take one document per example (`prefix_lm.gin`, `all_permute.gin`),
the others concatenate documents first (`denoise.gin`, `span.gin`); all but random spans corrupt
`inputs length - 1` raw tokens. tests/test_reference_objectives.py checks that a task gives the
reference pipeline's examples token for token for the same source and seed.

Targets are never cut silently: `unsupervised_objective` refuses a targets length that an
objective's targets would overflow (exactly, or for the i.i.d. objectives' random lengths more
often than once in a million examples) and names the length that fits; the rarer example that
still overflows is cut with a printed warning.
"""

from __future__ import annotations

import functools
import sys
from typing import Mapping

import numpy as np
import seqio
import tensorflow as tf
from scipy import stats

from t5x_like.families.t5 import preprocessors

# The reference draws random replacement tokens from [3, vocab_size): past pad (0), EOS (1) and
# UNK (2), sentinels included.
FIRST_ORDINARY_ID = 3
OBJECTIVES = (
    "prefix_lm",
    "bert_style",
    "deshuffling",
    "mass_style",
    "iid_replace_spans",
    "iid_drop_tokens",
    "random_spans",
)
# The corruption rate each objective's reference gin file fixes (the others take the task's).
FIXED_NOISE_DENSITY = {"prefix_lm": 0.5, "deshuffling": 1.0}
# A targets length is refused when more examples than this would overflow it (i.i.d. noise).
MAX_OVERFLOW_PROBABILITY = 1e-6


# ----------------------------------------------------------------------- noise masks
def iid_noise_mask(length: tf.Tensor, noise_density: float, seeds) -> tf.Tensor:
    """Each position is noise independently with probability `noise_density`."""
    return tf.random.stateless_uniform([length], seed=seeds[0]) < noise_density


def random_prefix_noise_mask(length: tf.Tensor, noise_density: float, seeds) -> tf.Tensor:
    """Prefix LM: the first k tokens are noise (the inputs), k uniform in
    [max(1, round((1 - 2 * density) * (length - 1))), length - 1]; at the reference's density
    0.5 every split that leaves a token on each side is equally likely."""
    if noise_density > 0.5:
        raise ValueError(f"A prefix noise density must be at most 0.5, got {noise_density}.")
    max_input_tokens = length - 1
    min_input_tokens = tf.minimum(
        max_input_tokens,
        tf.maximum(
            1,
            tf.cast(
                tf.math.round((1 - 2 * noise_density) * tf.cast(max_input_tokens, tf.float32)),
                tf.int32,
            ),
        ),
    )
    num_input_tokens = tf.random.stateless_uniform(
        [], minval=min_input_tokens, maxval=max_input_tokens + 1, dtype=tf.int32, seed=seeds[0]
    )
    return tf.range(length, dtype=tf.int32) < num_input_tokens


# ----------------------------------------------------------------------- span functions
def replace_noise_tokens(
    tokens: tf.Tensor,
    noise_mask: tf.Tensor,
    use_random: tf.Tensor,
    random_tokens: tf.Tensor,
    mask_id: int,
) -> tf.Tensor:
    """Noise positions become `mask_id`, or `random_tokens` where `use_random` is set."""
    replacement = tf.where(use_random, random_tokens, tf.cast(mask_id, tokens.dtype))
    return tf.where(noise_mask, replacement, tokens)


def noise_token_to_sentinel(
    tokens: tf.Tensor, noise_mask: tf.Tensor, vocabulary: seqio.Vocabulary, seeds=None
) -> tf.Tensor:
    """MASS-style: every noise token becomes the mask token (no random swaps)."""
    del seeds
    return tf.where(
        noise_mask, tf.cast(preprocessors.sentinel_id(vocabulary), tokens.dtype), tokens
    )


def noise_token_to_random_token_or_sentinel(
    tokens: tf.Tensor,
    noise_mask: tf.Tensor,
    vocabulary: seqio.Vocabulary,
    seeds,
    random_prob: float = 0.1,
    skip_sentinels: bool = False,
) -> tf.Tensor:
    """BERT-style as the paper adapts it: of the noise tokens, 90% become the mask token and
    10% a token drawn uniformly from [3, vocab_size) (the first seed picks which, the second
    the tokens, as in the T5 library). The reference's range includes the sentinels;
    `skip_sentinels=True` (a deviation, off by default) draws from ordinary pieces only."""
    shape = tf.shape(tokens)
    use_random = tf.random.stateless_uniform(shape, seed=seeds[0]) < random_prob
    high = vocabulary.vocab_size - (vocabulary.extra_ids if skip_sentinels else 0)
    random_tokens = tf.random.stateless_uniform(
        shape, minval=FIRST_ORDINARY_ID, maxval=high, dtype=tokens.dtype, seed=seeds[1]
    )
    return replace_noise_tokens(
        tokens, noise_mask, use_random, random_tokens, preprocessors.sentinel_id(vocabulary)
    )


def drop_noise_tokens(
    tokens: tf.Tensor, noise_mask: tf.Tensor, vocabulary: seqio.Vocabulary, seeds=None
) -> tf.Tensor:
    del vocabulary, seeds
    return tf.boolean_mask(tokens, tf.logical_not(noise_mask))


def drop_nonnoise_tokens(
    tokens: tf.Tensor, noise_mask: tf.Tensor, vocabulary: seqio.Vocabulary, seeds=None
) -> tf.Tensor:
    del vocabulary, seeds
    return tf.boolean_mask(tokens, noise_mask)


def permute_noise_tokens(
    tokens: tf.Tensor, noise_mask: tf.Tensor, vocabulary: seqio.Vocabulary, seeds
) -> tf.Tensor:
    """Deshuffling's input: the noise tokens in a random order, the others in place (the
    objective marks every token as noise, so the whole text is shuffled)."""
    del vocabulary
    permuted = seqio.stateless_shuffle(tf.boolean_mask(tokens, noise_mask), seeds[0])
    permuted = tf.pad(permuted, [[0, 1]])  # gather needs one element when nothing is noise
    indices = tf.cumsum(tf.cast(noise_mask, tf.int32), exclusive=True)
    return tf.where(noise_mask, tf.gather(permuted, indices), tokens)


# ----------------------------------------------------------------------- preprocessors
def _objective_fns(
    objective: str, mean_noise_span_length: float, clip_to_sentinels: bool, skip_sentinels: bool
):
    """(noise mask, inputs fn, targets fn or None for the original text) of an objective."""
    random_spans = functools.partial(
        preprocessors.random_spans_noise_mask, mean_noise_span_length=mean_noise_span_length
    )
    unique = (
        functools.partial(
            preprocessors.noise_span_to_unique_sentinel, clip_to_sentinels=clip_to_sentinels
        ),
        functools.partial(
            preprocessors.nonnoise_span_to_unique_sentinel, clip_to_sentinels=clip_to_sentinels
        ),
    )
    bert = functools.partial(noise_token_to_random_token_or_sentinel, skip_sentinels=skip_sentinels)
    table = {
        "prefix_lm": (random_prefix_noise_mask, drop_nonnoise_tokens, drop_noise_tokens),
        "bert_style": (iid_noise_mask, bert, None),
        "deshuffling": (iid_noise_mask, permute_noise_tokens, None),
        "mass_style": (iid_noise_mask, noise_token_to_sentinel, None),
        "iid_replace_spans": (iid_noise_mask,) + unique,
        "iid_drop_tokens": (iid_noise_mask, drop_noise_tokens, drop_nonnoise_tokens),
        "random_spans": (random_spans,) + unique,
    }
    return table[objective]


def check_objective(objective: str) -> None:
    if objective not in OBJECTIVES:
        raise ValueError(f"Unknown objective {objective!r}; choose one of {OBJECTIVES}.")


def raw_tokens_per_example(
    objective: str,
    sequence_length: Mapping[str, int],
    noise_density: float,
    mean_noise_span_length: float,
) -> int:
    """How many text tokens one example corrupts: for random spans the count whose inputs
    exactly fill sequence_length['inputs'] with EOS (`random_spans_helper`), for every other
    objective `inputs - 1`, as the reference's `split_tokens_to_inputs_length`."""
    if objective == "random_spans":
        return preprocessors.random_spans_helper(
            sequence_length["inputs"], noise_density, mean_noise_span_length
        )[0]
    return sequence_length["inputs"] - 1


def _tail_length(probabilities: np.ndarray) -> int:
    """The smallest length L with P(length > L) <= MAX_OVERFLOW_PROBABILITY."""
    tail = 1.0 - np.cumsum(probabilities)
    return int(np.argmax(tail <= MAX_OVERFLOW_PROBABILITY))


def _replace_spans_targets_distribution(length: int, density: float) -> np.ndarray:
    """P(targets hold c tokens, EOS aside) for i.i.d. replace spans on `length` tokens: the
    targets keep every noise token and put one sentinel for each run of kept tokens. Exact, by
    dynamic programming over positions (state: the count so far, and whether the last token
    was kept; the start counts as after noise, so a leading kept run has its sentinel)."""
    after_kept = np.zeros(2 * length + 2)
    after_noise = np.zeros(2 * length + 2)
    after_noise[0] = 1.0
    for _ in range(length):
        kept = after_kept * (1 - density)
        kept[1:] += after_noise[:-1] * (1 - density)  # a new kept run: its sentinel
        noise = np.zeros_like(after_kept)
        noise[1:] = (after_kept[:-1] + after_noise[:-1]) * density
        after_kept, after_noise = kept, noise
    return after_kept + after_noise


def targets_length_needed(
    objective: str,
    sequence_length: Mapping[str, int],
    noise_density: float,
    mean_noise_span_length: float,
) -> int:
    """The targets length (EOS included) that the objective's targets fit: exactly for the
    objectives whose targets length is fixed by the raw text, and for the i.i.d. objectives
    the length that more than one example in a million would overflow."""
    raw = raw_tokens_per_example(objective, sequence_length, noise_density, mean_noise_span_length)
    if objective == "random_spans":
        return preprocessors.random_spans_helper(
            sequence_length["inputs"], noise_density, mean_noise_span_length
        )[1]
    if objective == "prefix_lm":
        return max(raw - 1, 1) + 1  # at least one token stays in the prefix
    if objective == "iid_drop_tokens":
        return _tail_length(stats.binom.pmf(np.arange(raw + 1), raw, noise_density)) + 1
    if objective == "iid_replace_spans":
        return _tail_length(_replace_spans_targets_distribution(raw, noise_density)) + 1
    return raw + 1  # the original text


def check_targets_length(
    objective: str,
    sequence_length: Mapping[str, int],
    noise_density: float,
    mean_noise_span_length: float,
) -> None:
    """Refuse, before any data is read, a targets length the objective's targets overflow."""
    needed = targets_length_needed(
        objective, sequence_length, noise_density, mean_noise_span_length
    )
    have = sequence_length.get("targets")
    if have is not None and have < needed:
        how = (
            "more than one example in a million would be cut"
            if objective.startswith("iid")
            else "every example would be cut"
        )
        raise ValueError(
            f"The {objective} objective at inputs length {sequence_length['inputs']} (noise "
            f"{noise_density}, mean span {mean_noise_span_length}) makes targets of up to "
            f"{needed} tokens with EOS, but the targets length is {have}: {how}. Set the "
            f"targets length to at least {needed} (e.g. --gin.Data.task_feature_lengths="
            f"\"{{'inputs': {sequence_length['inputs']}, 'targets': {needed}}}\")."
        )


def warn_on_overflowing_targets(
    dataset: tf.data.Dataset, sequence_length: Mapping[str, int], objective: str
) -> tf.data.Dataset:
    """Print a warning for an example whose targets (with EOS) overflow the targets length,
    which `append_eos_after_trim` then cuts (for the i.i.d. objectives, rarer than one in a
    million at the accepted lengths)."""
    limit = sequence_length.get("targets")
    if limit is None:
        return dataset

    def warn(features):
        overflow = tf.size(features["targets"]) + 1 - limit

        def say():
            tf.print(
                "WARNING t5x_like:",
                objective,
                "example's targets overflow the targets length",
                limit,
                "by",
                overflow,
                "tokens and are cut.",
                output_stream=sys.stderr,
            )
            return features

        return tf.cond(overflow > 0, say, lambda: features)

    return dataset.map(warn, num_parallel_calls=tf.data.AUTOTUNE)


def unsupervised_objective(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, seqio.Feature],
    objective: str = "random_spans",
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
    clip_to_sentinels: bool = False,
    skip_sentinels: bool = False,
) -> tf.data.Dataset:
    """Any section 3.3 objective on a dataset of tokenized documents under `targets`, built as
    the T5 library's gin file for it builds its pipeline (same steps, same seeds).

    Deliberate deviations, off by default: `clip_to_sentinels` reuses the last sentinel past
    the vocabulary's extra ids (the reference counts down into ordinary pieces);
    `skip_sentinels` keeps BERT-style random tokens out of the sentinel ids.
    """
    check_objective(objective)
    noise_density = FIXED_NOISE_DENSITY.get(objective, noise_density)
    check_targets_length(objective, sequence_length, noise_density, mean_noise_span_length)
    if objective == "random_spans" and not clip_to_sentinels:  # the reference's own function
        dataset = preprocessors.span_corruption(
            dataset, sequence_length, output_features, mean_noise_span_length, noise_density
        )
        return warn_on_overflowing_targets(dataset, sequence_length, objective)
    dataset = preprocessors.select_random_chunk(dataset)
    if objective not in ("prefix_lm", "deshuffling"):  # one document per example
        dataset = preprocessors.reduce_concat_tokens(dataset)
    dataset = preprocessors.split_tokens(
        dataset,
        raw_tokens_per_example(objective, sequence_length, noise_density, mean_noise_span_length),
    )
    noise_mask_fn, inputs_fn, targets_fn = _objective_fns(
        objective, mean_noise_span_length, clip_to_sentinels, skip_sentinels
    )
    dataset = preprocessors.denoise(
        dataset, output_features, noise_density, noise_mask_fn, inputs_fn, targets_fn
    )
    return warn_on_overflowing_targets(dataset, sequence_length, objective)
