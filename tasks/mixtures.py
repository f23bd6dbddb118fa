"""Multi-task mixtures of the T5 paper (section 3.5.2) with its three mixing strategies as
seqio rate functions:

  examples-proportional, limit K   rate = min(examples, K)
  temperature-scaled, T (and K)     rate = min(examples, K) ** (1 / T)
  equal                             rate = 1

Mixtures:
  glue_v002_proportional, super_glue_v102_proportional      (examples-proportional, no limit)
  all_mix_proportional_k{2^16..2^21}   C4 span corruption + every supervised task, per K
  all_mix_temperature{2,8}             the same at T = 2 and 8 (K = 2^21)
  all_mix_equal                        the same, equal rates

Rates count the `train` examples TFDS recorded when it prepared each dataset (seqio's
`mixing_rate_num_examples`), so a mixture needs its datasets prepared.
"""

from __future__ import annotations

import functools
from typing import Callable

import seqio

from tasks import glue

RateFn = Callable[[seqio.Task], float]


def examples_proportional(maximum: int | None = None) -> RateFn:
    return functools.partial(seqio.mixing_rate_num_examples, maximum=maximum)


def temperature_scaled(temperature: float, maximum: int | None = None) -> RateFn:
    return functools.partial(seqio.mixing_rate_num_examples, maximum=maximum,
                             temperature=temperature)


def equal(task: seqio.Task) -> float:
    del task
    return 1.0


GLUE_TASKS = [f"glue_{b}_v002" for b in glue.GLUE_TRAIN]  # never WNLI; AX is test only
SUPER_GLUE_TASKS = [f"super_glue_{b}_v102" for b in ("boolq", "cb", "copa", "multirc", "record",
                                                      "rte", "wic")] + [
    "super_glue_wsc_v102_simple_train", "dpr_v001_simple"]
SUPERVISED_TASKS = GLUE_TASKS + SUPER_GLUE_TASKS + [
    "squad_v010_allanswers", "cnn_dailymail_v002", "wmt_t2t_ende_v003", "wmt14_enfr_v003",
    "wmt16_enro_v003"]
ALL_TASKS = ["c4_v220_span_corruption"] + SUPERVISED_TASKS
LIMITS = tuple(2**p for p in range(16, 22))
TEMPERATURES = (2, 8)

seqio.MixtureRegistry.add("glue_v002_proportional", GLUE_TASKS,
                          default_rate=examples_proportional())
seqio.MixtureRegistry.add("super_glue_v102_proportional", SUPER_GLUE_TASKS,
                          default_rate=examples_proportional())
for _k in LIMITS:
    seqio.MixtureRegistry.add(f"all_mix_proportional_k{_k}", ALL_TASKS,
                              default_rate=examples_proportional(_k))
for _t in TEMPERATURES:
    seqio.MixtureRegistry.add(f"all_mix_temperature{_t}", ALL_TASKS,
                              default_rate=temperature_scaled(_t, maximum=2**21))
seqio.MixtureRegistry.add("all_mix_equal", ALL_TASKS, default_rate=equal)
