"""SQuAD, CNN/Daily Mail and WMT as text-to-text seqio tasks with T5's names and metrics.

  squad_v010_allanswers   question + context -> answer; EM/F1 against every gold answer
  cnn_dailymail_v002      "summarize: ..." -> highlights; ROUGE-1/2/Lsum (T5 reported ROUGE-2-F)
  wmt_t2t_ende_v003       "translate English to German: ..."; SacreBLEU (newstest2013 val)
  wmt14_enfr_v003         "translate English to French: ..."; (newstest2014)
  wmt15_enfr_v003         the same on WMT 2015's training data, the paper's En-Fr task (the T5
                          library's mixtures use this one)
  wmt16_enro_v003         "translate English to Romanian: ..."

TFDS versions: T5 used cnn_dailymail 3.1.0 (TFDS 4.9 builds 3.4.0); `3.*.*` reads either.
"""

from __future__ import annotations

import functools

import seqio

from t5x_like import metrics
from t5x_like.families.t5 import postprocessors, text_to_text

from . import c4, pretraining


def _register(name, tfds_name, preprocessor, postprocess_fn, metric_fns):
    return seqio.TaskRegistry.add(
        name,
        source=seqio.TfdsDataSource(tfds_name=tfds_name),
        preprocessors=[
            preprocessor,
            seqio.preprocessors.tokenize,
            seqio.CacheDatasetPlaceholder(),
            seqio.preprocessors.append_eos_after_trim,
        ],
        output_features=pretraining.output_features(c4.c4_vocabulary()),
        postprocess_fn=postprocess_fn,
        metric_fns=metric_fns,
    )


_register(
    "squad_v010_allanswers",
    "squad/v1.1:3.*.*",
    text_to_text.squad,
    postprocessors.answers_from_example,
    [metrics.squad],
)
_register(
    "cnn_dailymail_v002",
    "cnn_dailymail:3.*.*",
    text_to_text.summarize,
    postprocessors.decode_text,
    [metrics.rouge],
)

WMT = {
    "wmt_t2t_ende_v003": ("wmt_t2t_translate/de-en:1.0.0", "de"),
    "wmt14_enfr_v003": ("wmt14_translate/fr-en:1.0.0", "fr"),
    "wmt15_enfr_v003": ("wmt15_translate/fr-en:1.0.0", "fr"),
    "wmt16_enro_v003": ("wmt16_translate/ro-en:1.0.0", "ro"),
}
for _name, (_tfds, _target) in WMT.items():
    _register(
        _name,
        _tfds,
        functools.partial(text_to_text.translate, source_language="en", target_language=_target),
        postprocessors.decode_text,
        [metrics.bleu],
    )
