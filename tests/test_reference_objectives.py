"""Every section 3.3 objective gives the T5 library's examples, token for token.

Reference: the T5 library (t5 0.9.4), run in its own process (tests/oracles/t5_objectives.py):
its registered tasks `c4_v220_span_corruption`, `c4_v220_prefix_lm`, `c4_v220_iid_denoising` and
`c4_v220_full_lm`, and for the other objectives the pipeline of the objective's gin file
(t5/models/gin/objectives/*.gin; `lm.gin` for the decoder-only LM objective). Both sides read the
same tiny real TFDS C4 (the reference's
c4/en:2.2.0, ours c4/en:3.1.0, with identical documents), tokenize with the same SentencePiece
model and take the same seed, so equal lists of (inputs, targets) mean the same pretraining
stream: the same chunks, concatenation, splits, noise, random tokens and sentinels.
"""

import pytest
import seqio

from t5x_like import tasks  # noqa: F401  (registers the tasks)
from t5x_like.families.t5 import objectives
from t5x_like.tasks import c4, pretraining
from tests.oracle import run_oracle
from tests.tiny_tfds import build_tiny_c4
from tests.word_vocab import WordVocabulary

# our task -> (the reference's task or objective gin file, inputs length)
CASES = {
    "c4_v220_span_corruption": ({"task": "c4_v220_span_corruption"}, 64),
    "c4_v220_prefix_lm": ({"task": "c4_v220_prefix_lm"}, 64),
    "c4_v220_iid_replace_spans_rate15": ({"task": "c4_v220_iid_denoising"}, 64),
    "c4_v220_bert_style": ({"gin": "iid_15_r10s90_f.gin"}, 64),
    "c4_v220_mass_style": ({"gin": "iid_15_m_f.gin"}, 64),
    "c4_v220_deshuffling": ({"gin": "all_permute.gin"}, 64),
    "c4_v220_iid_drop_tokens": ({"gin": "iid_15_d_d.gin"}, 64),
    "c4_v220_iid_replace_spans_rate10": ({"gin": "iid_10_u_u.gin"}, 64),
    "c4_v220_iid_replace_spans_rate25": ({"gin": "iid_25_u_u.gin"}, 64),
    # 512 inputs at 50 %: ~128 spans, past the 100 sentinels (the reference counts down into
    # ordinary pieces).
    "c4_v220_iid_replace_spans_rate50": ({"gin": "iid_50_u_u.gin"}, 512),
    "c4_v220_random_spans_mean2": ({"gin": "span_2_15_u_u.gin"}, 64),
    "c4_v220_random_spans_mean3": ({"gin": "span_3_15_u_u.gin"}, 64),
    "c4_v220_random_spans_mean5": ({"gin": "span_5_15_u_u.gin"}, 64),
    "c4_v220_random_spans_mean10": ({"gin": "span_10_15_u_u.gin"}, 64),
}
# the language-modelling tasks (targets only) -> the reference's, at targets length 64
LM_CASES = {
    "c4_v220_lm": {"gin": "lm.gin"},
    "c4_v220_full_lm": {"task": "c4_v220_full_lm"},
}
SEEDS = (0, 7)
NUM_TRAIN_DOCUMENTS = 24


def _settings(task_name: str) -> tuple[str, float, float]:
    """(objective, noise density, mean span) our registered task passes."""
    for p in seqio.get_mixture_or_task(task_name).preprocessors:
        if getattr(p, "func", None) is objectives.unsupervised_objective:
            kw = p.keywords
            return kw["objective"], kw["noise_density"], kw["mean_noise_span_length"]
    raise AssertionError(f"{task_name} has no unsupervised_objective step")


def _lengths(task_name: str, inputs_length: int) -> dict[str, int]:
    objective, density, span = _settings(task_name)
    density = objectives.FIXED_NOISE_DENSITY.get(objective, density)
    lengths = {"inputs": inputs_length, "targets": 0}
    lengths["targets"] = objectives.targets_length_needed(objective, lengths, density, span)
    return lengths


@pytest.fixture(scope="module")
def streams(tmp_path_factory):
    """(ours, reference's) examples for every case and seed."""
    from t5x_like.tasks import offline

    data_dir = str(tmp_path_factory.mktemp("tfds"))
    for version in ("2.2.0", "3.1.0"):
        build_tiny_c4(data_dir, version, num_train=NUM_TRAIN_DOCUMENTS, num_validation=2)
    spm_path = offline.offline_corpus.ensure_vocabulary()
    vocabulary = seqio.SentencePieceVocabulary(spm_path, extra_ids=c4.NUM_SENTINELS)
    loader = c4.C4_TFDS_SOURCE.tfds_dataset
    loader.override_data_dir(data_dir)
    ours, cases = {}, []
    features = pretraining.output_features(vocabulary)
    all_cases = {
        **{
            name: (reference, _lengths(name, inputs_length), features)
            for name, (reference, inputs_length) in CASES.items()
        },
        **{
            name: (reference, {"targets": 64}, {"targets": features["targets"]})
            for name, reference in LM_CASES.items()
        },
    }
    for name, (reference, lengths, output_features) in all_cases.items():
        task = seqio.get_mixture_or_task(name).replace(
            name=f"reference_check_{name}",
            source=c4.C4_TFDS_SOURCE,
            output_features=output_features,
        )
        for seed in SEEDS:
            key = f"{name}@{seed}"
            ds = task.get_dataset(
                lengths, split="train", shuffle=False, seed=seed, use_cached=False
            )
            ours[key] = [
                {k: ex[k].tolist() for k in ("inputs", "targets") if k in ex}
                for ex in ds.as_numpy_iterator()
            ]
            cases.append({"name": key, **reference, "sequence_length": lengths, "seed": seed})
    theirs = run_oracle(
        "t5_objectives", {"spm_path": spm_path, "data_dir": data_dir, "cases": cases}
    )
    return ours, theirs, vocabulary


@pytest.mark.parametrize("name", [*CASES, *LM_CASES])
@pytest.mark.parametrize("seed", SEEDS)
def test_task_equals_the_reference_stream(streams, name, seed):
    ours, theirs, _ = streams
    key = f"{name}@{seed}"
    assert len(ours[key]) > 5
    assert len(ours[key]) == len(theirs[key])
    for i, (a, b) in enumerate(zip(ours[key], theirs[key])):
        assert a == b, f"{key}: example {i} differs"


def test_seeds_give_different_streams(streams):
    """The comparison is not vacuous: the seed changes the corruption."""
    ours, _, _ = streams
    assert ours["c4_v220_span_corruption@0"] != ours["c4_v220_span_corruption@7"]


def test_the_two_language_models_differ_where_documents_end(streams):
    """`lm` rows run documents together with one EOS each, at the cut; `full_lm` has one EOS
    at each document's end: as many as the tiny C4's 24 training documents."""
    ours, _, vocabulary = streams
    eos = vocabulary.eos_id
    lm, full = ours["c4_v220_lm@0"], ours["c4_v220_full_lm@0"]
    assert all(ex["targets"].count(eos) == 1 and ex["targets"][-1] == eos for ex in lm)
    assert sum(ex["targets"].count(eos) for ex in full) == NUM_TRAIN_DOCUMENTS
    assert full[-1]["targets"][-1] == eos


def test_the_rate50_case_runs_past_the_sentinels(streams):
    """At 50 % over 511 tokens the reference's sentinels run past the vocabulary's 100 extra
    ids into ordinary pieces (so the equality above covers that count-down): the expected
    number of noise runs is 511 * 0.5 * 0.5 ~ 128, and the stream has examples of full length."""
    ours, _, _ = streams
    full = [ex for ex in ours["c4_v220_iid_replace_spans_rate50@0"] if len(ex["inputs"]) > 200]
    assert full and 511 * 0.5 * 0.5 > c4.NUM_SENTINELS


def test_clipped_sentinels_are_an_option():
    """`clip_to_sentinels` (a deviation, off by default) reuses the last sentinel instead."""
    import tensorflow as tf

    from t5x_like.families.t5 import preprocessors

    vocabulary = WordVocabulary([f"w{i}" for i in range(20)], extra_ids=3)  # ids 0..25
    tokens = tf.range(3, 13)
    mask = tf.constant([True, False] * 5)
    default = preprocessors.noise_span_to_unique_sentinel(tokens, mask, vocabulary).numpy()
    clipped = preprocessors.noise_span_to_unique_sentinel(
        tokens, mask, vocabulary, clip_to_sentinels=True
    ).numpy()
    assert default[::2].tolist() == [25, 24, 23, 22, 21]
    assert clipped[::2].tolist() == [25, 24, 23, 23, 23]
