"""Mixtures sample tasks in the proportions of the paper's three mixing strategies."""

import collections

import numpy as np
import pytest
import seqio
import tensorflow as tf

from t5x_like import tasks  # noqa: F401  (registers the tasks)
from t5x_like.tasks import mixtures
from tests.word_vocab import WordVocabulary

SIZES = {"small": 100, "medium": 1000, "large": 10000}
VOCAB = WordVocabulary(list(SIZES))


def _task(name, size):
    def dataset_fn(split, shuffle_files, seed=None):
        del split, shuffle_files, seed
        return tf.data.Dataset.from_tensors({"inputs": name, "targets": name}).repeat(size)

    features = {k: seqio.Feature(VOCAB, add_eos=False) for k in ("inputs", "targets")}
    seqio.TaskRegistry.remove(f"mix_test_{name}")
    return seqio.TaskRegistry.add(
        f"mix_test_{name}",
        source=seqio.FunctionDataSource(
            dataset_fn, splits=("train",), num_input_examples={"train": size}
        ),
        preprocessors=[seqio.preprocessors.tokenize],
        output_features=features,
    )


def _sample(rate, n=6000):
    for name, size in SIZES.items():
        _task(name, size)
    seqio.MixtureRegistry.remove("mix_test")
    mixture = seqio.MixtureRegistry.add(
        "mix_test", [f"mix_test_{n}" for n in SIZES], default_rate=rate
    )
    ds = mixture.get_dataset({"inputs": 4, "targets": 4}, split="train", shuffle=False, seed=0)
    counts = collections.Counter(
        VOCAB.decode(ex["inputs"].tolist()) for ex in ds.take(n).as_numpy_iterator()
    )
    return {name: counts[name] / n for name in SIZES}, mixture


def _expected(rates):
    total = sum(rates.values())
    return {k: v / total for k, v in rates.items()}


def test_examples_proportional_with_limit():
    got, mixture = _sample(mixtures.examples_proportional(maximum=2000))
    rates = {"small": 100, "medium": 1000, "large": 2000}  # min(examples, K)
    assert mixture.get_rate(seqio.get_mixture_or_task("mix_test_large")) == 2000
    for name, want in _expected(rates).items():
        assert got[name] == pytest.approx(want, abs=0.02), name


def test_temperature_scaled():
    got, _ = _sample(mixtures.temperature_scaled(2.0, maximum=2000))
    rates = {"small": 100**0.5, "medium": 1000**0.5, "large": 2000**0.5}
    for name, want in _expected(rates).items():
        assert got[name] == pytest.approx(want, abs=0.02), name


def test_equal_mixing():
    got, _ = _sample(mixtures.equal)
    for name in SIZES:
        assert got[name] == pytest.approx(1 / 3, abs=0.02), name


def test_registered_mixtures_hold_the_papers_tasks():
    """The mixtures under T5-library names are compared with the library's in
    tests/test_reference_mixtures.py; here our own Table 13 mixtures: C4 and every supervised
    task, plus the evaluation-only members at rate 0."""
    glue_mix = seqio.get_mixture_or_task("glue_v002_proportional")
    assert "glue_wnli_v002" not in {t.name for t in glue_mix.tasks}  # never trained on
    for k in mixtures.LIMITS:
        mix = seqio.get_mixture_or_task(f"all_mix_proportional_k{k}")
        tasks_k = {t.name for t in mix.tasks}
        assert "c4_v220_span_corruption" in tasks_k and "wmt16_enro_v003" in tasks_k
        assert tasks_k == set(mixtures.ALL_TASKS) | set(mixtures.EVAL_ONLY_TASKS)
        assert len(mixtures.ALL_TASKS) == 1 + 8 + 9 + 5
        for name in mixtures.EVAL_ONLY_TASKS:
            assert mix.get_rate(seqio.get_mixture_or_task(name)) == 0.0
    assert np.isclose(
        seqio.get_mixture_or_task("all_mix_equal").get_rate(
            seqio.get_mixture_or_task("squad_v010_allanswers")
        ),
        1.0,
    )
