"""Multi-task mixtures of the T5 paper (section 3.5.2) with its three mixing strategies as
seqio rate functions:

  examples-proportional, limit K   rate = min(examples, K)
  temperature-scaled, T (and K)     rate = min(examples, K) ** (1 / T)
  equal                             rate = 1

Mixtures under the T5 library's names (t5.data.mixtures), with its members and rates: each
training task weighted by its train-set size as the library counted it
(t5.data.glue_utils), and the tasks that are only evaluated (MNLI matched and mismatched,
WSC's evaluation format, the diagnostics) at rate 0, so that evaluating the mixture scores
every benchmark (seqio skips a task in training when it has no `train` split):
  glue_v002_proportional, super_glue_v102_proportional, glue_mnli_and_dev_v002,
  wsc_dpr_simple_proportional
Our own, for the paper's Table 13 rows (the library set K and T by gin instead):
  all_mix_proportional_k{2^16..2^21}   C4 span corruption + every supervised task, per K
  all_mix_temperature{2,8}             the same at T = 2 and 8 (K = 2^21)
  all_mix_equal                        the same, equal rates
These count the `train` examples TFDS recorded when it prepared each dataset (seqio's
`mixing_rate_num_examples`), so they need their datasets prepared; their evaluation-only
members have rate 0.
"""

from __future__ import annotations

import functools
from typing import Callable

import seqio

from . import generation, glue  # noqa: F401  (the member tasks)

RateFn = Callable[[seqio.Task], float]


def examples_proportional(maximum: int | None = None) -> RateFn:
    return functools.partial(seqio.mixing_rate_num_examples, maximum=maximum)


def temperature_scaled(temperature: float, maximum: int | None = None) -> RateFn:
    return functools.partial(
        seqio.mixing_rate_num_examples, maximum=maximum, temperature=temperature
    )


def equal(task: seqio.Task) -> float:
    del task
    return 1.0


# t5.data.glue_utils.GLUE_WEIGHT_MAPPING: WNLI is left out (T5 trains on WSC and DPR instead).
GLUE_WEIGHTS = {
    "glue_cola_v002": 8_551.0,
    "glue_sst2_v002": 67_349.0,
    "glue_mrpc_v002": 3_668.0,
    "glue_qqp_v002": 363_849.0,
    "glue_stsb_v002": 5_749.0,
    "glue_mnli_v002": 392_702.0,
    "glue_qnli_v002": 104_743.0,
    "glue_rte_v002": 2_490.0,
    "glue_mnli_mismatched_v002": 0.0,
    "glue_mnli_matched_v002": 0.0,
    "glue_ax_v002": 0.0,
}
# t5.data.glue_utils.SUPER_GLUE_WEIGHT_MAPPING
SUPER_GLUE_WEIGHTS = {
    "dpr_v001_simple": 1_322.0,
    "super_glue_wsc_v102_simple_train": 259.0,
    "super_glue_wsc_v102_simple_eval": 0.0,
    "super_glue_boolq_v102": 9_427.0,
    "super_glue_cb_v102": 250.0,
    "super_glue_copa_v102": 400.0,
    "super_glue_multirc_v102": 27_243.0,
    "super_glue_record_v102": 138_854.0,
    "super_glue_rte_v102": 2_490.0,
    "super_glue_wic_v102": 5_428.0,
    "super_glue_axb_v102": 0.0,
    "super_glue_axg_v102": 0.0,
}
WSC_DPR_TASKS = (
    "dpr_v001_simple",
    "super_glue_wsc_v102_simple_train",
    "super_glue_wsc_v102_simple_eval",
)

GLUE_TASKS = [t for t, w in GLUE_WEIGHTS.items() if w > 0]
SUPER_GLUE_TASKS = [t for t, w in SUPER_GLUE_WEIGHTS.items() if w > 0]
EVAL_ONLY_TASKS = [
    t for weights in (GLUE_WEIGHTS, SUPER_GLUE_WEIGHTS) for t, w in weights.items() if w == 0
]
SUPERVISED_TASKS = (
    GLUE_TASKS
    + SUPER_GLUE_TASKS
    + [
        "squad_v010_allanswers",
        "cnn_dailymail_v002",
        "wmt_t2t_ende_v003",
        "wmt15_enfr_v003",
        "wmt16_enro_v003",
    ]
)
ALL_TASKS = ["c4_v220_span_corruption"] + SUPERVISED_TASKS
LIMITS = tuple(2**p for p in range(16, 22))
TEMPERATURES = (2, 8)

_EVAL_ONLY = [(t, 0.0) for t in EVAL_ONLY_TASKS]

seqio.MixtureRegistry.add("glue_v002_proportional", list(GLUE_WEIGHTS.items()))
seqio.MixtureRegistry.add("super_glue_v102_proportional", list(SUPER_GLUE_WEIGHTS.items()))
seqio.MixtureRegistry.add(
    "glue_mnli_and_dev_v002", [t for t in GLUE_WEIGHTS if "mnli" in t], default_rate=1.0
)
seqio.MixtureRegistry.add(
    "wsc_dpr_simple_proportional", [(t, SUPER_GLUE_WEIGHTS[t]) for t in WSC_DPR_TASKS]
)
for _k in LIMITS:
    seqio.MixtureRegistry.add(
        f"all_mix_proportional_k{_k}",
        ALL_TASKS + _EVAL_ONLY,
        default_rate=examples_proportional(_k),
    )
for _t in TEMPERATURES:
    seqio.MixtureRegistry.add(
        f"all_mix_temperature{_t}",
        ALL_TASKS + _EVAL_ONLY,
        default_rate=temperature_scaled(_t, maximum=2**21),
    )
seqio.MixtureRegistry.add("all_mix_equal", ALL_TASKS + _EVAL_ONLY, default_rate=equal)
