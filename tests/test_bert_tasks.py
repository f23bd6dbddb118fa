"""BERT's fine-tuning tasks on tiny but real TFDS builds (GLUE MRPC, HellaSwag, CoNLL-2003,
SQuAD v1.1/v2.0): each example framed as Google BERT's code frames it (bert-tensorflow 1.0.4,
run in its own process: tests/oracles/bert_finetune.py; `run_classifier.convert_single_example`
for sentence pairs and for each SWAG ending as the paper's section 4.4 pairs them,
`run_squad.read_squad_examples` + `convert_examples_to_features` for SQuAD windows), CoNLL
tagging by a hand derivation (the reference has no NER code), and each gin recipe (SQuAD, SWAG,
NER feature-based) training a tiny BERT and scoring the validation split with its metric."""

import json
import os

import gin
import numpy as np
import pytest
import seqio

from t5x_like import gin_setup, train
from t5x_like.families.bert import features as bert_features
from t5x_like.families.bert import squad_eval
from tests.oracle import run_oracle
from tests.tiny_tfds import build_tiny

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "the",
    "cat",
    "sat",
    "on",
    "mat",
    "a",
    "dog",
    "ran",
    "far",
    "away",
    "who",
    "where",
    "did",
    "go",
    "##s",
    ".",
    "what",
    "then",
    "home",
    "slept",
    "john",
    "lives",
    "in",
    "paris",
    "?",
]
ID = {w: i for i, w in enumerate(WORDS)}
CONTEXT = "the cat sat on the mat . a dog ran far away"


def _squad(i, answerable=True):
    answer = "a dog" if i % 2 else "the mat"
    example = {
        "id": f"q{i}",
        "title": "t",
        "context": CONTEXT,
        "question": "who ran ?" if i % 2 else "where did the cat sit ?",
        "answers": {
            "text": [answer] if answerable else [],
            "answer_start": [CONTEXT.index(answer)] if answerable else [],
        },
    }
    return example


SQUAD_V2_EXTRA = {"is_impossible": False, "plausible_answers": {"text": [], "answer_start": []}}

DATASETS = {
    "glue/mrpc": {
        "train": [{"sentence1": "the cat sat", "sentence2": "a dog ran", "label": 1, "idx": 0}] * 4,
        "validation": [{"sentence1": "the dog sat", "sentence2": "a cat ran", "label": 0, "idx": 0}]
        * 2,
    },
    "hellaswag": {
        split: [
            {
                "context": "the dog ran",
                "endings": ["far away", "home", "the cat", "slept"],
                "activity_label": "x",
                "label": 1,
                "split_type": "indomain",
                "source_id": "s",
            }
        ]
        * 4
        for split in ("train", "validation")
    },
    "conll2003": {
        split: [
            {
                "tokens": ["john", "lives", "in", "paris", "dogs"],
                "pos": [0] * 5,
                "chunks": [0] * 5,
                "ner": [1, 0, 0, 5, 0],
            }
        ]
        * 4
        for split in ("train", "validation")
    },
    "squad/v1.1": {
        "train": [_squad(i) for i in range(4)],
        "validation": [_squad(i) for i in range(4)],
    },
    "squad/v2.0": {
        split: [
            {**_squad(i, answerable=i != 2), **SQUAD_V2_EXTRA, "is_impossible": i == 2}
            for i in range(4)
        ]
        for split in ("train", "validation")
    },
}
TASKS = {
    "glue/mrpc": "bert_glue_mrpc",
    "hellaswag": "bert_hellaswag",
    "conll2003": "bert_conll2003_ner",
    "squad/v1.1": "bert_squad_v110",
    "squad/v2.0": "bert_squad_v200",
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    from t5x_like import tasks  # noqa: F401

    path = tmp_path_factory.mktemp("tfds")
    for name, splits in DATASETS.items():
        build_tiny(name, splits, str(path))
        seqio.get_mixture_or_task(TASKS[name]).source.tfds_dataset.override_data_dir(str(path))
    vocab = path / "vocab.txt"
    vocab.write_text("\n".join(WORDS) + "\n")
    return path


def _squad_reference_case(split_name, version_2):
    examples = [
        {
            "id": ex["id"],
            "context": ex["context"],
            "question": ex["question"],
            "is_impossible": bool(ex.get("is_impossible", False)),
            "answers": [
                {"text": t, "answer_start": a}
                for t, a in zip(ex["answers"]["text"], ex["answers"]["answer_start"])
            ],
        }
        for ex in DATASETS[split_name]["train"]
    ]
    return {
        "examples": examples,
        "is_training": True,
        "version_2": version_2,
        "max_seq_length": 32,
        "doc_stride": 128,
        "max_query_length": 64,
    }


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Google BERT's features for this module's examples, from one oracle run: [0] the MRPC
    pair, [1:5] HellaSwag's context with each ending (length 16); SQuAD v1.1 and v2.0
    training windows (length 32, the tasks' stride 128 and query length 64)."""
    mrpc = DATASETS["glue/mrpc"]["train"][0]
    swag = DATASETS["hellaswag"]["train"][0]
    pairs = [(mrpc["sentence1"], mrpc["sentence2"])] + [
        (swag["context"], e) for e in swag["endings"]
    ]
    payload = {
        "dir": str(tmp_path_factory.mktemp("bert_reference")),
        "vocab": WORDS,
        "classifier": [{"a": a, "b": b, "max_seq_length": 16} for a, b in pairs],
        "squad": [
            _squad_reference_case("squad/v1.1", False),
            _squad_reference_case("squad/v2.0", True),
        ],
    }
    return run_oracle("bert_finetune", payload)


@pytest.fixture
def vocab_bound(data_dir):
    gin.bind_parameter("bert_vocab_path.path", str(data_dir / "vocab.txt"))
    return data_dir


def _first(task, converter, length=16, split="train"):
    ds = seqio.get_dataset(
        task,
        {"inputs": length},
        feature_converter=converter,
        dataset_split=split,
        shuffle=False,
        num_epochs=1,
    )
    return next(ds.as_numpy_iterator())


def _words(ids):
    return [WORDS[i] for i in ids if i]


def _assert_framed_as(ex, ref):
    for key in ("input_ids", "segment_ids", "input_mask"):
        assert np.asarray(ex[key]).tolist() == ref[key], key


def test_glue_pair_in_bert_format(vocab_bound, reference):
    ex = _first("bert_glue_mrpc", bert_features.ClassificationFeatureConverter())
    _assert_framed_as(ex, reference["classifier"][0])
    assert _words(ex["input_ids"]) == [
        "[CLS]",
        "the",
        "cat",
        "sat",
        "[SEP]",
        "a",
        "dog",
        "ran",
        "[SEP]",
    ]
    assert ex["label"] == 1.0 and ex["label_weights"] == 1.0  # the TFDS label, weight 1


def test_hellaswag_stacks_one_pair_per_ending(vocab_bound, reference):
    ex = _first("bert_hellaswag", bert_features.MultipleChoiceFeatureConverter(4))
    assert ex["input_ids"].shape == (4, 16)
    for choice in range(4):  # each ending: the context as A, the ending as B
        _assert_framed_as(
            {k: ex[k][choice] for k in ("input_ids", "segment_ids", "input_mask")},
            reference["classifier"][1 + choice],
        )
    assert [_words(row) for row in ex["input_ids"]] == [
        ["[CLS]", "the", "dog", "ran", "[SEP]"] + ending + ["[SEP]"]
        for ending in (["far", "away"], ["home"], ["the", "cat"], ["slept"])
    ]
    assert ex["label"] == 1.0  # the TFDS label


def test_conll_tags_the_first_piece_of_each_word(vocab_bound):
    """By hand (Google BERT has no NER code): the paper's section 5.3 feeds "the representation
    of the first sub-token" of each word to the tagger. "dogs" is "dog ##s" in this vocabulary
    (WordPiece's longest match first), so the words' tags [1, 0, 0, 5, 0] sit on positions
    1-5 after [CLS], "##s" gets weight 0, and [CLS]/[SEP] are not scored (tag 0, weight 0)."""
    ex = _first("bert_conll2003_ner", bert_features.TaggingFeatureConverter())
    assert _words(ex["input_ids"]) == [
        "[CLS]",
        "john",
        "lives",
        "in",
        "paris",
        "dog",
        "##s",
        "[SEP]",
    ]
    assert ex["labels"][:8].tolist() == [0, 1, 0, 0, 5, 0, 0, 0]
    assert ex["label_weights"][:8].tolist() == [0, 1, 1, 1, 1, 1, 0, 0]


def _span_features(task):
    ds = seqio.get_dataset(
        task,
        {"inputs": 32},
        feature_converter=bert_features.SpanFeatureConverter(),
        dataset_split="train",
        shuffle=False,
        num_epochs=1,
    )
    return list(ds.as_numpy_iterator())


def _as_reference(ex):
    return (
        tuple(ex["input_ids"].tolist()),
        tuple(ex["segment_ids"].tolist()),
        int(ex["start_position"]),
        int(ex["end_position"]),
    )


def test_squad_training_features_point_at_the_answer(vocab_bound, reference):
    ex = _first("bert_squad_v110", bert_features.SpanFeatureConverter(), length=32)
    ids = ex["input_ids"]
    assert _words(ids[ex["start_position"] : ex["end_position"] + 1]) == ["the", "mat"]
    for task, ref in zip(("bert_squad_v110", "bert_squad_v200"), reference["squad"]):
        ours = _span_features(task)
        assert ref["num_examples"] == 4
        want = [
            (
                tuple(_padded(f["input_ids"], 32)),
                tuple(_padded(f["segment_ids"], 32)),
                f["start_position"],
                f["end_position"],
            )
            for f in ref["features"]
        ]
        # TFDS stores the examples in its own order: compare as multisets
        assert sorted(map(_as_reference, ours)) == sorted(want), task
        for e in ours:
            assert e["input_mask"].tolist() == (e["input_ids"] != 0).astype(int).tolist()
    spans = [
        (int(e["start_position"]), int(e["end_position"]))
        for e in _span_features("bert_squad_v200")
    ]
    # one window per question; the unanswerable one points at [CLS]
    assert len(spans) == 4 and spans.count((0, 0)) == 1


def _padded(values, length):
    return list(values) + [0] * (length - len(values))


class _Oracle:
    """A span 'model' that points at the gold answer's first and last piece."""

    FEATURES = ("input_ids", "segment_ids", "input_mask", "start_position", "end_position")

    def predict(self, params, batch):
        import jax.numpy as jnp  # traced under jit

        ids, context = batch["input_ids"], batch["segment_ids"] == 1
        question_has_who = (ids == ID["who"]).any(-1, keepdims=True)
        first = jnp.where(question_has_who, ID["a"], ID["the"])
        last = jnp.where(question_has_who, ID["dog"], ID["mat"])
        start = ((ids == first) & context) * (10.0 + 0.1 * jnp.arange(ids.shape[1]))
        end = ((ids == last) & context) * 10.0
        return start, end


def test_squad_evaluation_scores_the_oracle_perfectly(vocab_bound):
    scores = squad_eval.evaluate_task(
        _Oracle(), None, "bert_squad_v110", "validation", {"inputs": 32}, batch_size=3
    )
    assert scores == {"em": 100.0, "f1": 100.0}


TINY_BERT = [
    "BertConfig.vocab_size=30",
    "BertConfig.hidden_size=32",
    "BertConfig.num_layers=1",
    "BertConfig.num_heads=2",
    "BertConfig.intermediate_size=64",
]
RECIPES = [
    pytest.param("bert_finetune_squad.gin", [], ("em", "f1"), id="squad"),
    pytest.param("bert_finetune_swag.gin", [], ("accuracy",), id="swag"),
    pytest.param(
        "bert_finetune_ner.gin",
        ["FEATURE_BASED=True", "BertTaggerModel.lstm_size=16"],
        ("f1", "precision", "recall", "token_accuracy"),
        id="ner_feature_based",
    ),
]


@pytest.mark.slow  # training runs: in the slow set that .ci/run runs after the default suite
@pytest.mark.parametrize("gin_file,extra,metric_names", RECIPES)
def test_fine_tuning_recipe_runs_and_scores_validation(
    gin_file, extra, metric_names, data_dir, tmp_path
):
    model_dir = tmp_path / "run"
    gin_setup.parse_gin(
        [
            os.path.join(ROOT, "gin_configs/models/bert/tiny.gin"),
            os.path.join(ROOT, "gin_configs/runs", gin_file),
        ],
        TINY_BERT
        + extra
        + [
            f"MODEL_DIR={model_dir}",
            f"bert_vocab_path.path={data_dir / 'vocab.txt'}",
            "Schedule.train_epochs=None",
            "TRAIN_STEPS=3",
            "BATCH_SIZE=8",
            "Data.task_feature_lengths={'inputs': 32}",
            "Evaluation.metrics_every=3",
            "Evaluation.metrics_batch_size=4",
            "train.log_every=3",
            "Checkpointing.every=3",
        ],
    )
    state = train.train()
    assert int(state.step) == 3
    best = json.loads((model_dir / "best" / "best.json").read_text())
    (task_scores,) = best.values()
    assert set(task_scores["metrics"]) == set(metric_names)
