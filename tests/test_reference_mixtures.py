"""The mixtures we register under T5-library names have the library's member tasks and mixing
rates, train on the same tasks, and evaluate the same tasks on each split, so fine-tuning on
glue_v002_proportional scores (and keeps a best checkpoint for) every GLUE task, MNLI's
matched and mismatched sets included.

Reference: t5==0.9.4's t5.data.mixtures (rates from t5.data.glue_utils), with the tasks t5x's
`seqio.Evaluator` would score (seqio.get_subtasks + seqio.evaluation.get_valid_eval_tasks),
run in tests/oracles/t5_mixtures.py. Both sides read the same tiny TFDS datasets, prepared
with each dataset's real split names, since a task's splits decide whether it is evaluated.
Equality is exact.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import seqio
import tensorflow_datasets as tfds

from t5x_like import (
    evaluation,
    input_pipeline,
    tasks,  # noqa: F401  (registers our tasks and mixtures)
)
from tests.oracle import run_oracle
from tests.oracles import t5_formats
from tests.tiny_tfds import build_tiny

MIXTURES = (
    "glue_v002_proportional",
    "super_glue_v102_proportional",
    "glue_mnli_and_dev_v002",
    "wsc_dpr_simple_proportional",
)
EVAL_SPLITS = ("train", "validation", "test")

_TVT = ("train", "validation", "test")
# Each TFDS dataset the mixtures read -> its splits (the TFDS catalog's).
SPLITS = {
    **{f"glue/{b}": _TVT for b in ("cola", "sst2", "mrpc", "qqp", "stsb", "qnli", "rte")},
    "glue/mnli": (
        "train",
        "validation_matched",
        "validation_mismatched",
        "test_matched",
        "test_mismatched",
    ),
    "glue/mnli_matched": ("validation", "test"),  # the reference reads these two configs
    "glue/mnli_mismatched": ("validation", "test"),
    "glue/ax": ("test",),
    **{
        f"super_glue/{b}": _TVT
        for b in ("boolq", "cb", "copa", "multirc", "record", "rte", "wic", "wsc.fixed")
    },
    "super_glue/axb": ("test",),
    "super_glue/axg": ("test",),
    "definite_pronoun_resolution": ("train", "test"),
}
# The reference reads GLUE at version 1.0.0, which today's TFDS cannot generate: the same
# files are also offered under that version.
REFERENCE_GLUE_VERSION = "1.0.0"


def _example(name: str) -> dict:
    spec = t5_formats.spec_to_json(tfds.builder(name).info.features.get_tensor_spec())
    given = {"candidates": ["the bee", "the flower"]} if "candidates" in spec else {}
    return t5_formats.complete_example(given, spec)


def _also_as_version(dataset_dir: str, version: str) -> None:
    target = os.path.join(os.path.dirname(dataset_dir), version)
    shutil.copytree(dataset_dir, target)
    info_path = os.path.join(target, "dataset_info.json")
    with open(info_path) as f:
        info = json.load(f)
    info["version"] = version
    with open(info_path, "w") as f:
        json.dump(info, f)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("tfds"))
    for name, splits in SPLITS.items():
        example = _example(name)
        built = build_tiny(name, {split: [example] for split in splits}, path)
        if name.startswith("glue/"):
            _also_as_version(built, REFERENCE_GLUE_VERSION)
    for name in seqio.TaskRegistry.names():  # (tests/conftest.py puts them back afterwards)
        source = seqio.get_mixture_or_task(name).source
        if isinstance(source, seqio.TfdsDataSource):
            source.tfds_dataset.override_data_dir(path)
    return path


@pytest.fixture(scope="module")
def reference(data_dir) -> dict:
    from t5x_like import offline_corpus

    return run_oracle(
        "t5_mixtures",
        {
            "spm_path": offline_corpus.vocabulary_path(),
            "data_dir": data_dir,
            "mixtures": list(MIXTURES),
            "splits": list(EVAL_SPLITS),
            "member_names": ["all_mix"],
        },
    )


@pytest.mark.parametrize("name", MIXTURES)
def test_members_and_rates_equal_the_reference(reference, name):
    mixture = seqio.get_mixture_or_task(name)
    assert {t.name: float(mixture.get_rate(t)) for t in mixture.tasks} == (reference[name]["rates"])


@pytest.mark.parametrize("name", MIXTURES)
def test_trained_tasks_equal_the_reference(data_dir, reference, name):
    mixture = seqio.get_mixture_or_task(name)
    trained = sorted(
        t.name for t in mixture.tasks if "train" in t.splits and mixture.get_rate(t) > 0
    )
    assert trained == reference[name]["trained"]


@pytest.mark.parametrize("split", EVAL_SPLITS)
@pytest.mark.parametrize("name", MIXTURES)
def test_evaluated_tasks_equal_the_reference(data_dir, reference, name, split):
    """What training's periodic evaluation and `python -m t5x_like.eval` score."""
    assert sorted(evaluation.evaluable_tasks(name, split)) == (reference[name]["evaluated"][split])


def test_all_mix_trains_the_reference_all_mix_tasks(reference):
    """Section 3.5.2's multi-task mixtures (ours: one per K or T) hold the reference
    `all_mix`'s members, WMT 2015 En-Fr and the zero-rate eval tasks included; the C4 task is
    the reference's `c4_v020_unsupervised` under the span-corruption objective."""
    for name in ("all_mix_proportional_k524288", "all_mix_temperature2", "all_mix_equal"):
        ours = {t.name for t in seqio.get_mixture_or_task(name).tasks}
        theirs = set(reference["members"]["all_mix"])
        assert ours - {"c4_v220_span_corruption"} == theirs - {"c4_v020_unsupervised"}


def test_glue_and_super_glue_evaluate_mnli_wsc_and_dpr(data_dir, reference):
    """The zero-rate members are what makes MNLI and WSC evaluated at all (glue_mnli_v002
    has no `validation` split); DPR has no validation split, so it is scored on `test`, as
    the reference's Evaluator would."""
    glue = evaluation.evaluable_tasks("glue_v002_proportional")
    assert {"glue_mnli_matched_v002", "glue_mnli_mismatched_v002"} <= set(glue)
    assert set(glue) == set(reference["glue_v002_proportional"]["evaluated"]["validation"])
    super_glue = evaluation.evaluable_tasks("super_glue_v102_proportional")
    assert "super_glue_wsc_v102_simple_eval" in super_glue
    assert "dpr_v001_simple" in evaluation.evaluable_tasks("super_glue_v102_proportional", "test")


@pytest.mark.parametrize("name", ("glue_v002_proportional", "super_glue_v102_proportional"))
def test_fine_tuning_reads_the_trained_members(data_dir, reference, name):
    """Training's start-up checks pass over the members without the split (as seqio's
    Mixture.get_dataset does) and count the members the reference trains on (one train
    example each here)."""
    mixture = seqio.get_mixture_or_task(name)
    for split in ("train", "validation"):
        input_pipeline.check_data_available(mixture, split)
    assert input_pipeline.steps_for_epochs(mixture, 1.0, batch_size=1) == len(
        reference[name]["trained"]
    )
