"""Every benchmark task of the T5 paper builds from a tiny real TFDS dataset (the registered
builder with only its download replaced) and yields, through TFDS, seqio and tokenization, the
text-to-text strings the T5 library's task of the same name writes for the same examples
(reference: t5==0.9.4's registered tasks, run in tests/oracles/t5_formats.py)."""

import pytest
import seqio

from t5x_like import (
    input_pipeline,
    tasks,  # noqa: F401  (registers the tasks)
)
from t5x_like.errors import ConfigError
from tests.tiny_tfds import build_tiny, with_offline_vocabulary

MNLI = {
    "premise": "I hate pigeons.",
    "hypothesis": "My feelings towards pigeons are filled with animosity.",
}
WSC_TEXT = (
    "Mark told Pete many lies about himself, which Pete included in his book. "
    "He should have been more truthful."
)
RECORD_PASSAGE = (
    "The harbour reopened on Monday after the storm.\n@highlight\nBoats returned "
    "to Porto\n@highlight\nThe mayor thanked the crews"
)
SQUAD_CONTEXT = (
    "Super Bowl 50 was an American football game. The Denver Broncos defeated the "
    "Carolina Panthers."
)

# tfds name -> ({split: [examples]}, version or None)
DATASETS = {
    "glue/cola": {
        "train": [
            {
                "sentence": "Our friends won't buy this analysis, let alone the "
                "next one we propose.",
                "label": 1,
                "idx": 0,
            }
        ],
        "validation": [{"sentence": "They drank the pub.", "label": 0, "idx": 0}],
    },
    "glue/sst2": {
        "train": [
            {"sentence": "it 's a charming and often affecting journey . ", "label": 1, "idx": 0}
        ]
    },
    "glue/mrpc": {
        "train": [
            {
                "sentence1": "He said the food was good.",
                "sentence2": "The food was good, he said.",
                "label": 1,
                "idx": 0,
            }
        ]
    },
    "glue/qqp": {
        "train": [
            {
                "question1": "How do I learn Python?",
                "question2": "What is the best way to learn Python?",
                "label": 1,
                "idx": 0,
            }
        ]
    },
    "glue/stsb": {
        "train": [
            {
                "sentence1": "A man is playing a flute.",
                "sentence2": "A man is playing a bamboo flute.",
                "label": 2.57,
                "idx": 0,
            }
        ]
    },
    "glue/mnli": {
        s: [{**MNLI, "label": 0 if s == "train" else 2, "idx": 0}]
        for s in (
            "train",
            "validation_matched",
            "validation_mismatched",
            "test_matched",
            "test_mismatched",
        )
    },
    "glue/qnli": {
        "train": [
            {
                "question": "Where did the storm hit?",
                "sentence": "The storm hit the coast.",
                "label": 0,
                "idx": 0,
            }
        ]
    },
    "glue/rte": {
        "train": [
            {
                "sentence1": "The cat sat on the mat.",
                "sentence2": "A cat sat.",
                "label": 0,
                "idx": 0,
            }
        ]
    },
    "glue/wnli": {
        "validation": [
            {
                "sentence1": "The trophy doesn't fit in the suitcase because it is too big.",
                "sentence2": "The trophy is too big.",
                "label": 1,
                "idx": 0,
            }
        ]
    },
    "glue/ax": {"test": [{**MNLI, "label": -1, "idx": 0}]},
    "super_glue/boolq": {
        "train": [
            {
                "question": "is the sky blue",
                "passage": "The sky is blue on clear days.",
                "label": 1,
                "idx": 0,
            }
        ]
    },
    "super_glue/cb": {
        "train": [{"premise": "It was raining.", "hypothesis": "It was dry.", "label": 1, "idx": 0}]
    },
    "super_glue/copa": {
        "train": [
            {
                "premise": "The man broke his toe.",
                "question": "cause",
                "choice1": "He got a hole in his sock.",
                "choice2": "He dropped a hammer on his foot.",
                "label": 1,
                "idx": 0,
            }
        ]
    },
    "super_glue/multirc": {
        "train": [
            {
                "paragraph": "Sent 1: The <b>fox</b> ran.<br>Sent 2: It hid.",
                "question": "What ran?",
                "answer": "The fox",
                "label": 1,
                "idx": {"paragraph": 3, "question": 4, "answer": 5},
            }
        ]
    },
    "super_glue/record": {
        "train": [
            {
                "passage": RECORD_PASSAGE,
                "query": "The crews of @placeholder were thanked.",
                "entities": ["Porto", "Monday"],
                "answers": ["Porto", "Porto harbour"],
                "idx": {"passage": 7, "query": 8},
            }
        ]
    },
    "super_glue/rte": {
        "train": [
            {"premise": "The cat sat on the mat.", "hypothesis": "A cat sat.", "label": 0, "idx": 0}
        ]
    },
    "super_glue/wic": {
        "train": [
            {
                "sentence1": "He went to the bank to fish.",
                "sentence2": "The bank approved the loan.",
                "word": "bank",
                "start1": 15,
                "end1": 19,
                "start2": 4,
                "end2": 8,
                "label": 0,
                "idx": 0,
            }
        ]
    },
    "super_glue/wsc.fixed": {
        "train": [
            {
                "text": WSC_TEXT,
                "span1_text": "Mark",
                "span1_index": 0,
                "span2_text": "He",
                "span2_index": 13,
                "label": 1,
                "idx": 0,
            },
            {
                "text": WSC_TEXT,
                "span1_text": "Pete",
                "span1_index": 2,
                "span2_text": "He",
                "span2_index": 13,
                "label": 0,
                "idx": 1,
            },
        ],
        "validation": [
            {
                "text": WSC_TEXT,
                "span1_text": "Pete",
                "span1_index": 2,
                "span2_text": "He",
                "span2_index": 13,
                "label": 0,
                "idx": 0,
            }
        ],
    },
    "definite_pronoun_resolution": {
        "train": [
            {
                "sentence": "The bee landed on the flower because it had pollen.",
                "pronoun": "it",
                "candidates": ["The bee", "the flower"],
                "label": 1,
            }
        ]
    },
    "squad/v1.1": {
        "validation": [
            {
                "id": "q1",
                "title": "Super_Bowl_50",
                "question": "Which NFL team won Super Bowl 50?",
                "context": SQUAD_CONTEXT,
                "answers": {"text": ["Denver Broncos", "the Broncos"], "answer_start": [49, 45]},
            }
        ]
    },
    "cnn_dailymail": {
        "train": [
            {
                "article": "The harbour reopened on Monday.",
                "highlights": "Harbour reopens .\nCrews thanked .",
                "id": "a1",
                "publisher": "cnn",
            }
        ]
    },
    "wmt_t2t_translate/de-en": {"train": [{"en": "That is good.", "de": "Das ist gut."}]},
    "wmt14_translate/fr-en": {"train": [{"en": "That is good.", "fr": "C'est bon."}]},
    "wmt16_translate/ro-en": {"train": [{"en": "That is good.", "ro": "Este bine."}]},
}

# task, split -> the TFDS dataset and split it reads
READS = {
    ("glue_cola_v002", "train"): ("glue/cola", "train"),
    ("glue_cola_v002", "validation"): ("glue/cola", "validation"),
    ("glue_sst2_v002", "train"): ("glue/sst2", "train"),
    ("glue_mrpc_v002", "train"): ("glue/mrpc", "train"),
    ("glue_qqp_v002", "train"): ("glue/qqp", "train"),
    ("glue_stsb_v002", "train"): ("glue/stsb", "train"),
    ("glue_mnli_v002", "train"): ("glue/mnli", "train"),
    ("glue_mnli_mismatched_v002", "validation"): ("glue/mnli", "validation_mismatched"),
    ("glue_qnli_v002", "train"): ("glue/qnli", "train"),
    ("glue_rte_v002", "train"): ("glue/rte", "train"),
    ("glue_wnli_v002", "validation"): ("glue/wnli", "validation"),
    ("glue_ax_v002", "test"): ("glue/ax", "test"),
    ("super_glue_boolq_v102", "train"): ("super_glue/boolq", "train"),
    ("super_glue_cb_v102", "train"): ("super_glue/cb", "train"),
    ("super_glue_copa_v102", "train"): ("super_glue/copa", "train"),
    ("super_glue_multirc_v102", "train"): ("super_glue/multirc", "train"),
    ("super_glue_record_v102", "train"): ("super_glue/record", "train"),
    ("super_glue_rte_v102", "train"): ("super_glue/rte", "train"),
    ("super_glue_wic_v102", "train"): ("super_glue/wic", "train"),
    # WSC trains on True examples only; evaluation sees every candidate.
    ("super_glue_wsc_v102_simple_train", "train"): ("super_glue/wsc.fixed", "train"),
    ("super_glue_wsc_v102_simple_eval", "validation"): ("super_glue/wsc.fixed", "validation"),
    ("dpr_v001_simple", "train"): ("definite_pronoun_resolution", "train"),
    ("squad_v010_allanswers", "validation"): ("squad/v1.1", "validation"),
    ("cnn_dailymail_v002", "train"): ("cnn_dailymail", "train"),
    ("wmt_t2t_ende_v003", "train"): ("wmt_t2t_translate/de-en", "train"),
    ("wmt14_enfr_v003", "train"): ("wmt14_translate/fr-en", "train"),
    ("wmt16_enro_v003", "train"): ("wmt16_translate/ro-en", "train"),
}


@pytest.fixture(scope="module")
def reference():
    """(inputs, targets) the T5 library's task writes for each (task, split)'s examples."""
    import tensorflow_datasets as tfds

    from t5x_like import offline_corpus
    from tests.oracle import run_oracle
    from tests.oracles import t5_formats

    cases = [
        {
            "id": f"{task}:{split}",
            "task": task,
            "examples": DATASETS[name][tfds_split],
            "spec": t5_formats.spec_to_json(tfds.builder(name).info.features.get_tensor_spec()),
        }
        for (task, split), (name, tfds_split) in READS.items()
    ]
    out = run_oracle("t5_formats", {"spm_path": offline_corpus.vocabulary_path(), "cases": cases})[
        "outputs"
    ]
    return {key: [(o["inputs"], o["targets"]) for o in out[f"{key[0]}:{key[1]}"]] for key in READS}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tfds")
    for name, splits in DATASETS.items():
        build_tiny(name, splits, str(path))
    build_tiny("cnn_dailymail", DATASETS["cnn_dailymail"], str(path), version="3.1.0")
    for task, _ in READS:
        seqio.get_mixture_or_task(task).source.tfds_dataset.override_data_dir(str(path))
    return path


@pytest.mark.parametrize("task_name,split", list(READS))
def test_text_to_text_examples_equal_the_reference(data_dir, reference, task_name, split):
    task = seqio.get_mixture_or_task(task_name)
    input_pipeline.check_data_available(task, split)
    variant = with_offline_vocabulary(task_name, f"tfds_{task_name}")
    ds = variant.get_dataset({"inputs": 256, "targets": 64}, split=split, shuffle=False)
    got = [
        (ex["inputs_pretokenized"].decode(), ex["targets_pretokenized"].decode())
        for ex in ds.as_numpy_iterator()
    ]
    assert sorted(got) == sorted(reference[(task_name, split)])
    for ex in ds.as_numpy_iterator():  # tokenized, with EOS
        assert ex["inputs"][-1] == 1 and ex["targets"][-1] == 1


def test_label_names_match_tfds(data_dir):
    """The hard-coded label names (used to write and parse targets) are TFDS' own, in order."""
    import tensorflow_datasets as tfds

    from t5x_like.tasks import glue

    for b, (names, _) in glue.GLUE.items():
        if names is not None:
            assert tuple(tfds.builder(f"glue/{b}").info.features["label"].names) == names, b
    for b, (names, _) in glue.SUPER_GLUE.items():
        tfds_names = tfds.builder(f"super_glue/{b}").info.features["label"].names
        assert tuple(tfds_names) == names, b


def test_cnn_dailymail_versions_t5_used_and_newer_are_both_read(data_dir):
    import tensorflow_datasets as tfds

    assert {p.name for p in (data_dir / "cnn_dailymail").iterdir()} >= {"3.1.0", "3.4.0"}
    builder = tfds.builder("cnn_dailymail:3.1.0", data_dir=str(data_dir))
    assert next(iter(builder.as_dataset(split="train")))["article"].numpy() == (
        b"The harbour reopened on Monday."
    )
    source = seqio.get_mixture_or_task("cnn_dailymail_v002").source.tfds_dataset
    assert source.name == "cnn_dailymail:3.*.*"


def test_postprocessors_and_metrics_through_the_task(data_dir):
    """Predictions go through each task's own postprocessor and metric."""

    def score(task_name, split, predictions):
        task = seqio.get_mixture_or_task(task_name)
        variant = with_offline_vocabulary(task_name, f"score_{task_name}")
        examples = list(
            variant.get_dataset(
                {"inputs": 256, "targets": 64}, split=split, shuffle=False
            ).as_numpy_iterator()
        )
        targets = [
            task.postprocess_fn(ex["targets_pretokenized"], example=ex, is_target=True)
            for ex in examples
        ]
        preds = [
            task.postprocess_fn(p, example=ex, is_target=False)
            for p, ex in zip(predictions, examples)
        ]
        out = {}
        for fn in task.metric_fns:
            out.update(fn(targets, preds))
        return out

    assert score("glue_cola_v002", "validation", ["unacceptable"])["matthews_corrcoef"] == 0.0
    assert score("glue_mnli_v002", "train", ["entailment"])["accuracy"] == 100.0
    assert score("glue_mnli_v002", "train", ["Entailment"])["accuracy"] == 0.0  # not a label
    # WSC: "Pete" is not the referent; the model saying "Mark" means "not Pete" -> correct.
    assert score("super_glue_wsc_v102_simple_eval", "validation", ["mark"])["accuracy"] == 100.0
    assert score("super_glue_wsc_v102_simple_eval", "validation", ["the Pete"])["accuracy"] == 0
    # ReCoRD: two examples (one per answer) of one query count once.
    got = score("super_glue_record_v102", "train", ["Porto", "Porto"])
    assert got == {"em": 100.0, "f1": 100.0}
    # SQuAD: "Broncos" equals gold "the Broncos" after normalisation; "Denver" only half-
    # matches "Denver Broncos" (P 1, R 1/2).
    assert score("squad_v010_allanswers", "validation", ["Broncos"])["em"] == 100.0
    got = score("squad_v010_allanswers", "validation", ["Denver"])
    assert got["em"] == 0.0 and got["f1"] == pytest.approx(100 * 2 * 1 * 0.5 / 1.5)
    got = score("super_glue_multirc_v102", "train", ["True"])
    assert got == {"f1": 100.0, "exact_match": 100.0}  # t5's multirc_f1_over_all_answers
    assert score("wmt_t2t_ende_v003", "train", ["Das ist gut."])["bleu"] == pytest.approx(100.0)


def test_missing_tfds_dataset_says_how_to_prepare_it(tmp_path):
    task = seqio.get_mixture_or_task("super_glue_boolq_v102")
    task.source.tfds_dataset.override_data_dir(str(tmp_path))
    with pytest.raises(ConfigError, match=r"tfds build super_glue/boolq --data_dir=DIR"):
        input_pipeline.check_data_available(task, "train")
