"""Pretraining tasks: any section 3.3 objective on a text source, one definition shared by the
C4, local-shard and offline corpora.

`register_objectives(prefix, ...)` registers the paper's whole comparison on one source:

  {prefix}_span_corruption                  the baseline: random spans, 15%, mean length 3
  {prefix}_prefix_lm, _bert_style, _deshuffling, _mass_style, _iid_drop_tokens
  {prefix}_iid_replace_spans_rate{10,15,25,50}   i.i.d. replace spans at each corruption rate
  {prefix}_random_spans_mean{2,3,5,10}            random spans at 15% with each mean length
"""

from __future__ import annotations

import functools

import seqio

from t5x_like.families.t5 import objectives, preprocessors

CORRUPTION_RATES = (10, 15, 25, 50)
MEAN_SPAN_LENGTHS = (2, 3, 5, 10)
SINGLE_RATE_OBJECTIVES = ("prefix_lm", "bert_style", "deshuffling", "mass_style", "iid_drop_tokens")


def output_features(vocabulary: seqio.Vocabulary) -> dict[str, seqio.Feature]:
    """inputs/targets on one shared vocabulary, each ending with EOS (T5's layout)."""
    return {
        "inputs": seqio.Feature(vocabulary=vocabulary, add_eos=True, required=False),
        "targets": seqio.Feature(vocabulary=vocabulary, add_eos=True),
    }


def register(
    name: str,
    source: seqio.DataSource,
    vocabulary: seqio.Vocabulary,
    text_key: str = "text",
    objective: str = "random_spans",
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
) -> seqio.Task:
    """Register one objective on `source` (documents under `text_key`)."""
    objectives.check_objective(objective)
    return seqio.TaskRegistry.add(
        name,
        source=source,
        preprocessors=[
            functools.partial(
                seqio.preprocessors.rekey, key_map={"inputs": None, "targets": text_key}
            ),
            seqio.preprocessors.tokenize,
            seqio.CacheDatasetPlaceholder(),
            functools.partial(
                objectives.unsupervised_objective,
                objective=objective,
                noise_density=noise_density,
                mean_noise_span_length=mean_noise_span_length,
            ),
            seqio.preprocessors.append_eos_after_trim,
        ],
        output_features=output_features(vocabulary),
        metric_fns=[],
    )


def register_objectives(
    prefix: str, source: seqio.DataSource, vocabulary: seqio.Vocabulary, text_key: str = "text"
) -> list[str]:
    """Register every objective and setting of the paper's section 3.3 on one source."""
    settings = {f"{prefix}_span_corruption": ("random_spans", 0.15, 3.0)}
    settings.update({f"{prefix}_{o}": (o, 0.15, 3.0) for o in SINGLE_RATE_OBJECTIVES})
    settings.update(
        {
            f"{prefix}_iid_replace_spans_rate{r}": ("iid_replace_spans", r / 100, 3.0)
            for r in CORRUPTION_RATES
        }
    )
    settings.update(
        {
            f"{prefix}_random_spans_mean{m}": ("random_spans", 0.15, float(m))
            for m in MEAN_SPAN_LENGTHS
        }
    )
    for name, (objective, density, mean_span) in settings.items():
        register(name, source, vocabulary, text_key, objective, density, mean_span)
    return list(settings)


LANGUAGE_MODELS = {
    # suffix: (pipeline, its EOS step after it)
    "lm": (preprocessors.language_model, [seqio.preprocessors.append_eos_after_trim]),
    "full_lm": (preprocessors.full_language_model, []),
}


def register_language_models(
    prefix: str, source: seqio.DataSource, vocabulary: seqio.Vocabulary, text_key: str = "text"
) -> list[str]:
    """Plain language modelling on `source`, `targets` only (a decoder-only model with seqio's
    DecoderFeatureConverter predicts every token), in the T5 library's two forms:

      {prefix}_lm       documents run together, EOS where each row is cut (`lm.gin`: Table 2's
                        LM objective for the decoder-only language model)
      {prefix}_full_lm  EOS at each document's end (`c4_v220_full_lm`; GPT pretraining)
    """
    names = []
    for suffix, (pipeline, eos_steps) in LANGUAGE_MODELS.items():
        names.append(f"{prefix}_{suffix}")
        seqio.TaskRegistry.add(
            names[-1],
            source=source,
            preprocessors=[
                functools.partial(seqio.preprocessors.rekey, key_map={"targets": text_key}),
                seqio.preprocessors.tokenize,
                seqio.CacheDatasetPlaceholder(),
                pipeline,
                *eos_steps,
            ],
            output_features={"targets": output_features(vocabulary)["targets"]},
            metric_fns=[],
        )
    return names
