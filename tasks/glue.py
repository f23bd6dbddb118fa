"""GLUE and SuperGLUE (plus DPR) as text-to-text seqio tasks with T5's names, formats,
postprocessors and metrics (T5 paper section 2.3 and appendix D).

  glue_{cola,sst2,mrpc,qqp,stsb,mnli,qnli,rte,wnli}_v002, glue_mnli_{matched,mismatched}_v002,
  glue_ax_v002 (diagnostic, test only, read with the MNLI format)
  super_glue_{boolq,cb,copa,multirc,record,rte,wic}_v102,
  super_glue_{axb,axg}_v102 (diagnostics, test only, read with the RTE format),
  super_glue_wsc_v102_simple_train (True examples only), super_glue_wsc_v102_simple_eval,
  dpr_v001_simple

Each is registered as t5.data.tasks registers the task of the same name (the same text
preprocessor and arguments; tests/test_reference_formats.py runs both on the same examples);
the diagnostics have no metrics there (their test labels are hidden), nor here.

WNLI is registered for evaluation only and is in no training mixture (the paper never trains
or reports on it). All use T5's C4 vocabulary (tasks/c4.py).
"""

from __future__ import annotations

import functools
from typing import Callable, Mapping, Sequence

import seqio

from t5x_like import metrics
from t5x_like.families.t5 import postprocessors, text_to_text

from . import c4, pretraining

GLUE_VERSION = "2.*.*"
SUPER_GLUE_VERSION = "1.0.2"

# label names (TFDS ClassLabel order; None = regression) and metrics of each benchmark
GLUE: dict[str, tuple[Sequence[str] | None, list[Callable]]] = {
    "cola": (("unacceptable", "acceptable"), [metrics.matthews_corrcoef]),
    "sst2": (("negative", "positive"), [metrics.accuracy]),
    "mrpc": (("not_equivalent", "equivalent"), [metrics.f1_and_accuracy]),
    "qqp": (("not_duplicate", "duplicate"), [metrics.f1_and_accuracy]),
    "stsb": (None, [metrics.pearson_and_spearman]),
    "mnli": (("entailment", "neutral", "contradiction"), [metrics.accuracy]),
    "qnli": (("entailment", "not_entailment"), [metrics.accuracy]),
    "rte": (("entailment", "not_entailment"), [metrics.accuracy]),
    "wnli": (("not_entailment", "entailment"), [metrics.accuracy]),
}

SUPER_GLUE: dict[str, tuple[Sequence[str], list[Callable]]] = {
    "boolq": (("False", "True"), [metrics.accuracy]),
    "cb": (("entailment", "contradiction", "neutral"), [metrics.mean_multiclass_f1(3)]),
    "copa": (("choice1", "choice2"), [metrics.accuracy]),
    "multirc": (("False", "True"), [metrics.multirc_f1a_and_em]),
    "rte": (("entailment", "not_entailment"), [metrics.accuracy]),
    "wic": (("False", "True"), [metrics.accuracy]),
}
# Field order where it is not alphabetical (t5.data.glue_utils.get_glue_text_preprocessor);
# WiC's character offsets are not text.
FEATURE_NAMES = {
    "multirc": ("question", "answer", "paragraph"),
    "wic": ("sentence1", "sentence2", "word"),
}
# AX-b's sentence pairs are read as RTE's premise and hypothesis (t5.data.tasks).
AXB_REKEY = {"premise": "sentence1", "hypothesis": "sentence2", "label": "label", "idx": "idx"}


def _features() -> Mapping[str, seqio.Feature]:
    return pretraining.output_features(c4.c4_vocabulary())


def _tail() -> list:
    return [
        seqio.preprocessors.tokenize,
        seqio.CacheDatasetPlaceholder(),
        seqio.preprocessors.append_eos_after_trim,
    ]


def _classification_postprocessor(label_names: Sequence[str] | None, benchmark: str):
    if label_names is None:
        return postprocessors.string_to_float
    if benchmark == "multirc":
        # t5's `multirc` groups answers by idx/question alone.
        return functools.partial(
            postprocessors.grouped_class_id, label_classes=label_names, group_keys=("idx_question",)
        )
    return functools.partial(postprocessors.string_label_to_class_id, label_classes=label_names)


def register_glue_like(
    name: str,
    tfds_name: str,
    benchmark: str,
    label_names: Sequence[str] | None,
    metric_fns: list[Callable],
    splits: Sequence[str] | Mapping[str, str] | None = None,
    key_map: Mapping[str, str] | None = None,
) -> seqio.Task:
    """A GLUE-format task; `key_map` (new name -> TFDS name) renames features first."""
    rekey = [functools.partial(seqio.preprocessors.rekey, key_map=dict(key_map))] if key_map else []
    return seqio.TaskRegistry.add(
        name,
        source=seqio.TfdsDataSource(tfds_name=tfds_name, splits=splits),
        preprocessors=rekey
        + [
            functools.partial(
                text_to_text.glue,
                benchmark_name=benchmark,
                label_names=label_names,
                feature_names=FEATURE_NAMES.get(benchmark),
            )
        ]
        + _tail(),
        output_features=_features(),
        postprocess_fn=_classification_postprocessor(label_names, benchmark),
        metric_fns=metric_fns,
    )


# ------------------------------------------------------------------------------ GLUE
for _b, (_labels, _metrics) in GLUE.items():
    register_glue_like(
        f"glue_{_b}_v002",
        f"glue/{_b}:{GLUE_VERSION}",
        _b,
        _labels,
        _metrics,
        splits=(
            [
                "train",
                "validation_matched",
                "validation_mismatched",
                "test_matched",
                "test_mismatched",
            ]
            if _b == "mnli"
            else None
        ),
    )
for _which in ("matched", "mismatched"):
    register_glue_like(
        f"glue_mnli_{_which}_v002",
        f"glue/mnli:{GLUE_VERSION}",
        "mnli",
        GLUE["mnli"][0],
        [metrics.accuracy],
        splits={"validation": f"validation_{_which}", "test": f"test_{_which}"},
    )
register_glue_like(
    "glue_ax_v002", f"glue/ax:{GLUE_VERSION}", "mnli", GLUE["mnli"][0], [], splits={"test": "test"}
)

# ------------------------------------------------------------------------------ SuperGLUE
for _b, (_labels, _metrics) in SUPER_GLUE.items():
    register_glue_like(
        f"super_glue_{_b}_v102", f"super_glue/{_b}:{SUPER_GLUE_VERSION}", _b, _labels, _metrics
    )
register_glue_like(
    "super_glue_axb_v102",
    f"super_glue/axb:{SUPER_GLUE_VERSION}",
    "rte",
    SUPER_GLUE["rte"][0],
    [],
    splits=("test",),
    key_map=AXB_REKEY,
)
register_glue_like(
    "super_glue_axg_v102",
    f"super_glue/axg:{SUPER_GLUE_VERSION}",
    "rte",
    SUPER_GLUE["rte"][0],
    [],
    splits=("test",),
)

seqio.TaskRegistry.add(
    "super_glue_record_v102",
    source=seqio.TfdsDataSource(tfds_name=f"super_glue/record:{SUPER_GLUE_VERSION}"),
    preprocessors=[text_to_text.record] + _tail(),
    output_features=_features(),
    postprocess_fn=postprocessors.record_answers,
    metric_fns=[metrics.record],
)

_WSC = f"super_glue/wsc.fixed:{SUPER_GLUE_VERSION}"
seqio.TaskRegistry.add(
    "super_glue_wsc_v102_simple_train",
    source=seqio.TfdsDataSource(tfds_name=_WSC, splits=("train",)),
    preprocessors=[text_to_text.keep_true_examples, text_to_text.wsc_simple] + _tail(),
    output_features=_features(),
    postprocess_fn=postprocessors.wsc_simple,
    metric_fns=[],
)  # training only, as in t5
seqio.TaskRegistry.add(
    "super_glue_wsc_v102_simple_eval",
    source=seqio.TfdsDataSource(tfds_name=_WSC, splits=("validation", "test")),
    preprocessors=[text_to_text.wsc_simple] + _tail(),
    output_features=_features(),
    postprocess_fn=postprocessors.wsc_simple,
    metric_fns=[metrics.accuracy],
)
seqio.TaskRegistry.add(
    "dpr_v001_simple",
    source=seqio.TfdsDataSource(tfds_name="definite_pronoun_resolution:1.1.0"),
    preprocessors=[text_to_text.definite_pronoun_resolution_simple] + _tail(),
    output_features=_features(),
    postprocess_fn=postprocessors.decode_text,
    metric_fns=[metrics.accuracy],
)
