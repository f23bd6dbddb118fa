"""One definition of a span-corruption pretraining task, shared by the C4 and offline tasks."""

from __future__ import annotations

import functools

import seqio

from t5x_like import preprocessors


def output_features(vocabulary: seqio.Vocabulary) -> dict[str, seqio.Feature]:
    """inputs/targets on one shared vocabulary, each ending with EOS (T5's layout)."""
    return {
        "inputs": seqio.Feature(vocabulary=vocabulary, add_eos=True, required=False),
        "targets": seqio.Feature(vocabulary=vocabulary, add_eos=True),
    }


def register(name: str, source: seqio.DataSource, vocabulary: seqio.Vocabulary,
             text_key: str = "text", noise_density: float = 0.15,
             mean_noise_span_length: float = 3.0) -> seqio.Task:
    """Register T5's span corruption on `source` (documents under `text_key`)."""
    return seqio.TaskRegistry.add(
        name,
        source=source,
        preprocessors=[
            functools.partial(seqio.preprocessors.rekey,
                              key_map={"inputs": None, "targets": text_key}),
            seqio.preprocessors.tokenize,
            seqio.CacheDatasetPlaceholder(),
            functools.partial(preprocessors.span_corruption, noise_density=noise_density,
                              mean_noise_span_length=mean_noise_span_length),
            seqio.preprocessors.append_eos_after_trim,
        ],
        output_features=output_features(vocabulary),
        metric_fns=[],
    )
