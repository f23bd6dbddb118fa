"""GPT-1 fine-tuning tasks (Radford et al., 2018, section 3.3): the paper's input
transformations with learned start / delimiter / extract tokens, numeric labels (not
text-to-text).

  gpt_glue_{cola,sst2}                      classification
  gpt_glue_{mnli,qnli,rte,wnli}             entailment (premise [delim] hypothesis)
  gpt_glue_mnli_{matched,mismatched}        MNLI's two validation sets
  gpt_glue_{mrpc,qqp,stsb}                  similarity: both orderings (STS-B: regression)
  gpt_race_{high,middle}                    RACE multiple choice (4 options per question)
  gpt_story_cloze                           Story Cloze 2016 (2 endings; TFDS needs its manual
                                            download; trained on the validation set and
                                            evaluated on the test set, as the paper)
  gpt_offline_word_order                    offline: original (1) or shuffled (0) word order

Vocabulary: the C4 SentencePiece vocabulary (that of `c4_v220_full_lm`, the GPT pretraining task
on C4) for the benchmarks, the offline vocabulary for the offline task. Each task records the
head it needs (`GPTClassifierModel.num_labels` / `.combine`) in `t5x_like.data.task_heads`; the
trainer checks the model against it.
"""

from __future__ import annotations

import seqio

from t5x_like import metrics
from t5x_like.data import task_heads
from t5x_like.families.gpt import preprocessors as gp

from . import bert, c4, offline

_HEAD_OF_TRANSFORM = {
    "classification": "single",
    "entailment": "single",
    "similarity": "sum_orderings",
    "choices": "choices",
}


def _register(
    name: str,
    source: seqio.DataSource,
    vocabulary: seqio.Vocabulary,
    kind: str,
    text_keys: tuple[str, ...],
    metric_fns,
    num_labels: int,
    pre=(),
) -> seqio.Task:
    combine = _HEAD_OF_TRANSFORM[kind]
    task_heads.register(name, num_labels, combine)
    rank = 1 if combine == "single" else 2
    return seqio.TaskRegistry.add(
        name,
        source=source,
        preprocessors=[*pre, gp.transform(kind, text_keys)],
        output_features={"inputs": seqio.Feature(vocabulary, add_eos=False, rank=rank)},
        metric_fns=list(metric_fns),
    )


_C4_VOCABULARY = c4.c4_vocabulary()
_KIND = {
    "cola": "classification",
    "sst2": "classification",
    "mrpc": "similarity",
    "qqp": "similarity",
    "stsb": "similarity",
    "mnli": "entailment",
    "qnli": "entailment",
    "rte": "entailment",
    "wnli": "entailment",
}

for _b, (_keys, _labels, _metrics) in bert.GLUE.items():
    _splits = ["train", "validation_matched", "validation_mismatched"] if _b == "mnli" else None
    _register(
        f"gpt_glue_{_b}",
        seqio.TfdsDataSource(f"glue/{_b}:{bert.GLUE_VERSION}", splits=_splits),
        _C4_VOCABULARY,
        _KIND[_b],
        _keys,
        _metrics,
        _labels,
    )
for _which in ("matched", "mismatched"):
    _register(
        f"gpt_glue_mnli_{_which}",
        seqio.TfdsDataSource(
            f"glue/mnli:{bert.GLUE_VERSION}", splits={"validation": f"validation_{_which}"}
        ),
        _C4_VOCABULARY,
        "entailment",
        bert.GLUE["mnli"][0],
        [metrics.accuracy],
        3,
    )

for _level in ("high", "middle"):
    _register(
        f"gpt_race_{_level}",
        seqio.TfdsDataSource(
            f"race/{_level}:2.*.*", splits={"train": "train", "validation": "dev", "test": "test"}
        ),
        _C4_VOCABULARY,
        "choices",
        ("context", "candidates"),
        [metrics.accuracy],
        4,
        pre=[gp.race_questions],
    )

_register(
    "gpt_story_cloze",
    seqio.TfdsDataSource(
        "story_cloze/2016:1.*.*", splits={"train": "validation", "validation": "test"}
    ),
    _C4_VOCABULARY,
    "choices",
    ("context", "endings"),
    [metrics.accuracy],
    2,
)

_register(
    "gpt_offline_word_order",
    offline.OFFLINE_SOURCE,
    offline.OfflineVocabulary(),
    "classification",
    ("sentence",),
    [metrics.accuracy],
    2,
    pre=[bert.word_order_examples],
)
