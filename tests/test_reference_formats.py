"""Every task we register under a T5-library name writes the T5 library's exact `inputs` and
`targets` (and SQuAD's / ReCoRD's `answers`) strings, and its format postprocessors read
predictions as the library's do.

Reference: the tasks t5==0.9.4 registers (t5.data.tasks: its preprocessor lists as
registered, so the task-to-preprocessor wiring is checked too, up to the tokenize step;
t5.data.postprocessors through each task's postprocess_fn), run in tests/oracles/t5_formats.py
on the same raw examples, typed as the TFDS datasets decode them. Equality is exact.
"""

from __future__ import annotations

import pytest
import seqio
import tensorflow_datasets as tfds

from t5x_like import tasks  # noqa: F401  (registers our tasks)
from tests.oracle import run_oracle
from tests.oracles import t5_formats

MNLI = [
    {
        "premise": "I hate pigeons.",
        "hypothesis": "My feelings towards pigeons are filled with animosity.",
        "label": 0,
        "idx": 0,
    },
    {
        "premise": "Ünïcödé “quotes” — and a back\\slash \\1.",
        "hypothesis": "",
        "label": 2,
        "idx": 1,
    },
    {
        "premise": "Tabs\tand\nnewlines  and  double spaces ",
        "hypothesis": 'It\'s "fine".',
        "label": -1,
        "idx": 2,
    },
]
PAIR = [
    {
        "sentence1": "He said the food was good.",
        "sentence2": "The food was good, he said.",
        "label": 1,
        "idx": 0,
    },
    {"sentence1": "Ünïcödé “quotes” \\1 \\\\ $1", "sentence2": "", "label": 0, "idx": 1},
    {"sentence1": "A <b>bold</b> claim<br>", "sentence2": "x " * 300, "label": -1, "idx": 2},
]
LONG = " ".join(f"Sentence {i} is (rather) long, isn't it? Yes: it's_long!" for i in range(80))
WSC_TEXT = (
    "Mark told Pete many lies about himself, which Pete included in his book. "
    "He should have been more truthful."
)
WSC_SPECIAL = (
    "The boy continued to whip the pony , and eventually the pony threw him over. "
    'John laughed out quite loud. "Good for him," he said. '
)
WSC = [
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
    # The pronoun is the last word: the reference leaves the X unmarked.
    {
        "text": "The man lifted the boy onto his shoulders because he",
        "span1_text": "The man",
        "span1_index": 0,
        "span2_text": "he",
        "span2_index": 9,
        "label": -1,
        "idx": 2,
    },
    # Double spaces count as empty words; another standalone X is marked too.
    {
        "text": "Player X  beat Tom  because he trained.",
        "span1_text": "Tom",
        "span1_index": 4,
        "span2_text": "he",
        "span2_index": 7,
        "label": 1,
        "idx": 3,
    },
    {
        "text": WSC_SPECIAL,
        "span1_text": "the pony",
        "span1_index": 7,
        "span2_text": "him",
        "span2_index": 22,
        "label": 0,
        "idx": 4,
    },
    {
        "text": "Ünïcödé Anna met “Zoë” and she smiled.",
        "span1_text": "Anna",
        "span1_index": 1,
        "span2_text": "she",
        "span2_index": 5,
        "label": 1,
        "idx": 5,
    },
]
DPR = [
    {
        "sentence": "The bee landed on the flower because it had pollen.",
        "pronoun": "it",
        "candidates": ["The bee", "the flower"],
        "label": 1,
    },
    {
        "sentence": "Tom gave Bill the book because he was finished with it.",
        "pronoun": "it",
        "candidates": ["the book", "Bill"],
        "label": 0,
    },  # 'it' before '.'
    {
        "sentence": "Anna thanked Mia, for she helped her, she said.",
        "pronoun": "she",
        "candidates": ["Anna", "Mia"],
        "label": 1,
    },
    {
        "sentence": "Kim called Lee and asked him, since he knew.",
        "pronoun": "him",
        "candidates": ["Kim", "Lee"],
        "label": 1,
    },  # 'him' before ','
    {
        "sentence": "He left before Sam arrived because he was late.",
        "pronoun": "he",
        "candidates": ["Sam", "the man"],
        "label": 0,
    },  # first 'He' has no space before it
    {
        "sentence": "The kit fit, yet it broke; it.",
        "pronoun": "it",
        "candidates": ["the kit", "the box"],
        "label": 0,
    },
    {
        "sentence": "Zoë told Ünal that “she” won.",
        "pronoun": "she",
        "candidates": ["Zoë", "Ünal"],
        "label": 0,
    },  # quoted: no match
]
RECORD = [
    {
        "passage": "The harbour reopened on Monday after the storm.\n@highlight\nBoats returned "
        'to Porto\n@highlight\nThe mayor thanked the crews!\n@highlight\nAll "safe"',
        "query": "The crews of @placeholder were thanked.",
        "entities": ["Porto", "Monday"],
        "answers": ["Porto", "Porto"],
        "idx": {"passage": 7, "query": 8},
    },
    {
        "passage": "Ünïcödé São Paulo’s mayor said.\n@highlight\nIt's 'quoted'\n@highlight\nEnd?",
        "query": "@placeholder said so.",
        "entities": ["São Paulo", "mayor", "Ünïcödé"],
        "answers": [],
        "idx": {"passage": 9, "query": 10},
    },  # a test example: no answers
    {
        "passage": LONG,
        "query": "Which @placeholder?",
        "entities": ["Sentence 3"],
        "answers": ["Sentence 3", "sentence 3", "3"],
        "idx": {"passage": 11, "query": 12},
    },
]
SQUAD_CONTEXT = (
    "Super Bowl 50 was an American football game. The Denver Broncos defeated "
    "the Carolina Panthers 24–10 (in “Levi's Stadium”), on_field: $5,000\\fee."
)
SQUAD = [
    {
        "id": "q1",
        "title": "Super_Bowl_50",
        "question": "Which NFL team won Super Bowl 50?",
        "context": SQUAD_CONTEXT,
        "answers": {
            "text": ["Denver Broncos", "the Broncos.", " Broncos "],
            "answer_start": [49, 45, 55],
        },
    },
    {
        "id": "q2",
        "title": "T",
        "question": "  What's   the fee?\t",
        "context": LONG,
        "answers": {"text": ["$5,000\\fee."], "answer_start": [0]},
    },
    {
        "id": "q3",
        "title": "T",
        "question": "Ünïcödé – où? (a_b) [c] {d} ~e^ `f` |g| @h #i %j",
        "context": "",
        "answers": {"text": ["«ici»", "a_b"], "answer_start": [0, 1]},
    },
]
CNN = [
    {
        "article": "The harbour reopened on Monday.\n\nÜnïcödé “quotes” \\1.",
        "highlights": "Harbour reopens .\nCrews thanked .",
        "id": "a1",
        "publisher": "cnn",
    },
    {"article": "", "highlights": "", "id": "a2", "publisher": "dailymail"},
    {"article": LONG, "highlights": "It's long .", "id": "a3", "publisher": "cnn"},
]


def _wmt(language: str) -> list[dict]:
    return [
        {"en": "That is good.", language: "Ünïcödé “gut” \\1."},
        {"en": "", language: ""},
        {"en": LONG, language: "It's\tlong\n."},
    ]


SUPER = {
    "super_glue/boolq": [
        {
            "question": "is the sky blue",
            "passage": "The sky is blue on clear days.",
            "label": 1,
            "idx": 0,
        },
        {"question": "does it “work”?", "passage": LONG, "label": -1, "idx": 1},
    ],
    "super_glue/cb": [{**ex, "label": min(ex["label"], 2)} for ex in MNLI],
    "super_glue/copa": [
        {
            "premise": "The man broke his toe.",
            "question": "cause",
            "choice1": "He got a hole in his sock.",
            "choice2": "He dropped a hammer on his foot.",
            "label": 1,
            "idx": 0,
        },
        {
            "premise": "Ünïcödé.",
            "question": "effect",
            "choice1": "",
            "choice2": "\\1",
            "label": -1,
            "idx": 1,
        },
    ],
    "super_glue/multirc": [
        {
            "paragraph": "Sent 1: The <b>fox</b> ran.<br>Sent 2: It hid.<br><br>",
            "question": "What <b>ran</b>?",
            "answer": "The fox",
            "label": 1,
            "idx": {"paragraph": 3, "question": 4, "answer": 5},
        },
        {
            "paragraph": LONG,
            "question": "Ünïcödé?",
            "answer": "",
            "label": -1,
            "idx": {"paragraph": 3, "question": 5, "answer": 6},
        },
    ],
    "super_glue/record": RECORD,
    "super_glue/rte": [
        {
            "premise": ex["premise"],
            "hypothesis": ex["hypothesis"],
            "label": max(min(ex["label"], 1), -1),
            "idx": ex["idx"],
        }
        for ex in MNLI
    ],
    "super_glue/wic": [
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
        },
        {"sentence1": "Ünïcödé", "sentence2": "", "word": "ü", "label": -1, "idx": 1},
    ],
    "super_glue/wsc.fixed": WSC,
    "super_glue/axb": [
        {
            "sentence1": ex["sentence1"],
            "sentence2": ex["sentence2"],
            "label": -1 if i else 0,
            "idx": i,
        }
        for i, ex in enumerate(PAIR)
    ],
    "super_glue/axg": [
        {
            "premise": ex["premise"],
            "hypothesis": ex["hypothesis"],
            "label": -1 if i else 1,
            "idx": i,
        }
        for i, ex in enumerate(MNLI)
    ],
}
GLUE = {
    "glue/cola": [
        {"sentence": ex["sentence1"], "label": ex["label"], "idx": ex["idx"]} for ex in PAIR
    ],
    "glue/sst2": [
        {"sentence": "it 's a charming and often affecting journey . ", "label": 1, "idx": 0},
        {"sentence": LONG, "label": -1, "idx": 1},
    ],
    "glue/mrpc": PAIR,
    "glue/qqp": [
        {
            "question1": ex["sentence1"],
            "question2": ex["sentence2"],
            "label": ex["label"],
            "idx": ex["idx"],
        }
        for ex in PAIR
    ],
    # Half-way scores show the rounding (to even, as tf.round does); -1 marks test examples.
    "glue/stsb": [
        {
            "sentence1": "A man is playing a flute.",
            "sentence2": "A man is playing a bamboo flute.",
            "label": score,
            "idx": i,
        }
        for i, score in enumerate((2.57, 0.0, 5.0, 2.5, 3.1, 0.1, 0.3, 4.9, -1.0))
    ],
    "glue/mnli": MNLI,
    "glue/qnli": [
        {
            "question": ex["premise"],
            "sentence": ex["hypothesis"],
            "label": max(min(ex["label"], 1), -1),
            "idx": ex["idx"],
        }
        for ex in MNLI
    ],
    "glue/rte": PAIR,
    "glue/wnli": PAIR,
    "glue/ax": [{**ex, "label": -1} for ex in MNLI],
}
DATASETS = {
    **GLUE,
    **SUPER,
    "definite_pronoun_resolution": DPR,
    "squad/v1.1": SQUAD,
    "cnn_dailymail": CNN,
    "wmt_t2t_translate/de-en": _wmt("de"),
    "wmt14_translate/fr-en": _wmt("fr"),
    "wmt15_translate/fr-en": _wmt("fr"),
    "wmt16_translate/ro-en": _wmt("ro"),
}

# Every task we register under a T5-library name that writes text -> the TFDS dataset it reads
# (MNLI's matched / mismatched evaluation sets are configs of glue/mnli with its features).
TASKS = {
    **{
        f"glue_{b}_v002": f"glue/{b}"
        for b in ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli", "ax")
    },
    "glue_mnli_matched_v002": "glue/mnli",
    "glue_mnli_mismatched_v002": "glue/mnli",
    **{
        f"super_glue_{b}_v102": f"super_glue/{b}"
        for b in ("boolq", "cb", "copa", "multirc", "record", "rte", "wic", "axb", "axg")
    },
    "super_glue_wsc_v102_simple_train": "super_glue/wsc.fixed",
    "super_glue_wsc_v102_simple_eval": "super_glue/wsc.fixed",
    "dpr_v001_simple": "definite_pronoun_resolution",
    "squad_v010_allanswers": "squad/v1.1",
    "cnn_dailymail_v002": "cnn_dailymail",
    "wmt_t2t_ende_v003": "wmt_t2t_translate/de-en",
    "wmt14_enfr_v003": "wmt14_translate/fr-en",
    "wmt15_enfr_v003": "wmt15_translate/fr-en",
    "wmt16_enro_v003": "wmt16_translate/ro-en",
}
# Predictions read by the format postprocessors (WSC's referent match, ReCoRD's and SQuAD's
# answers): determiners, case, possessives, empty and spacing variants.
PREDICTIONS = {
    "super_glue_wsc_v102_simple_eval": [
        "",
        "the",
        "Mark",
        "mark's",
        "the Pete",
        "Pete  ",
        "pete and mark",
        "He",
        "his book",
        " the  man ",
    ],
    "super_glue_record_v102": ["Porto", "porto", ""],
    "squad_v010_allanswers": ["Denver Broncos", "the Broncos .", ""],
}
# Pre-training tasks (checked against the reference elsewhere); they write no text format.
PRETRAINING_PREFIXES = ("c4_",)


def _spec(tfds_name: str) -> dict:
    return t5_formats.spec_to_json(tfds.builder(tfds_name).info.features.get_tensor_spec())


@pytest.fixture(scope="module")
def cases() -> list[dict]:
    specs = {name: _spec(name) for name in DATASETS}
    return [
        {
            "id": task,
            "task": task,
            "spec": specs[name],
            "examples": DATASETS[name],
            "predictions": PREDICTIONS.get(task),
        }
        for task, name in TASKS.items()
    ]


@pytest.fixture(scope="module")
def reference(cases) -> dict:
    from t5x_like import offline_corpus

    return run_oracle("t5_formats", {"spm_path": offline_corpus.vocabulary_path(), "cases": cases})


def _ours(case: dict) -> dict:
    """Our registered task's text preprocessors (and postprocessor) on the case."""
    task = seqio.get_mixture_or_task(case["task"])
    examples = t5_formats.text_examples(task, case["examples"], case["spec"])
    out = {"outputs": [t5_formats.texts(ex) for ex in examples]}
    if case["predictions"]:
        out["postprocessed"] = [
            t5_formats.postprocess(task, ex, case["predictions"]) for ex in examples
        ]
    return out


@pytest.fixture(scope="module")
def ours(cases) -> dict:
    by_task = {case["task"]: case for case in cases}
    done: dict[str, dict] = {}

    def get(task_name: str) -> dict:
        if task_name not in done:
            done[task_name] = _ours(by_task[task_name])
        return done[task_name]

    return get


@pytest.mark.parametrize("task_name", list(TASKS))
def test_text_equals_the_reference_tasks(reference, ours, task_name):
    assert ours(task_name)["outputs"] == reference["outputs"][task_name]


@pytest.mark.parametrize("task_name", list(TASKS))
def test_tokenized_the_same_way(reference, task_name):
    """After the text: tokenize, the cache point, EOS after trimming, as the reference."""
    ours = t5_formats.tail_names(seqio.get_mixture_or_task(task_name))
    assert ours == reference["tails"][task_name]


def test_every_task_with_a_reference_name_is_compared(reference):
    """A task we register under a name the T5 library also registers is in TASKS (or is a
    pre-training task, compared elsewhere)."""
    shared = set(seqio.TaskRegistry.names()) & set(reference["names"])
    text_tasks = {n for n in shared if not n.startswith(PRETRAINING_PREFIXES)}
    assert text_tasks == set(TASKS)


def test_wsc_postprocessor_equals_the_reference(reference, ours):
    name = "super_glue_wsc_v102_simple_eval"
    assert ours(name)["postprocessed"] == reference["postprocessed"][name]


def test_squad_answers_equal_the_reference(reference, ours):
    name = "squad_v010_allanswers"
    assert ours(name)["postprocessed"] == reference["postprocessed"][name]


def test_record_answers_and_query_equal_the_reference(reference, ours):
    """A target is every gold answer and the query's id; a prediction its text."""
    name = "super_glue_record_v102"
    assert ours(name)["postprocessed"] == reference["postprocessed"][name]
