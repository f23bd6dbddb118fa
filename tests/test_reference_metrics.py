"""Every task's postprocessor + metrics equal the T5 library's on the same decoded text.

Reference: t5 0.9.4 (`t5.data.tasks` registrations, `t5.data.postprocessors`,
`t5.evaluation.metrics`, `t5.evaluation.qa_utils`), run in its own process
(tests/oracles/t5_metrics.py). For each task we register under a T5-library name that has
metrics, randomized and edge-case (targets, predictions) sets -- invalid labels, labels with
spaces or in another case, empty strings, unicode, punctuation, ties, constant predictions
(undefined correlation), multi-answer SQuAD, ReCoRD queries with several answers, MultiRC
question groups, ROUGE summaries with several sentences, BLEU -- go through our task's
`postprocess_fn` and `metric_fns` here and through the T5 library's task of the same name
there. They must give the same metric names, in the same order, and the same values (floats
within 1e-9 relative, 1e-12 absolute; NaN where the reference gives NaN), the same
postprocessed targets and predictions (MultiRC's and ReCoRD's question groups compared as the
partition they induce), or the same exception type. A few metric functions are also
compared directly where a task does not reach them (ROUGE's stemming option, BLEU with
several references, SQuAD without a gold answer). NumPy's global random state is seeded
identically on both sides before the metrics: ROUGE's bootstrap aggregation draws from it.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import seqio

from t5x_like import (
    metrics,
    tasks,  # noqa: F401  (registers our tasks)
)
from t5x_like.tasks import glue
from tests.oracle import jsonable, run_oracle

GLUE_CLASSIFICATION = ["cola", "sst2", "mrpc", "qqp", "mnli", "qnli", "rte", "wnli"]
SUPER_GLUE_CLASSIFICATION = ["boolq", "cb", "copa", "rte", "wic"]
WMT_TASKS = ["wmt_t2t_ende_v003", "wmt14_enfr_v003", "wmt15_enfr_v003", "wmt16_enro_v003"]

# Outputs that are not labels, whatever the task.
NON_LABELS = [
    "",
    " ",
    "garbage",
    "True False",
    "n/a",
    "entailment.",
    "équivalent",
    "\u00a0",
    "-1",
    "0",
    "1",
    "None",
    "négatif",
    "中立",
]


def _label_tasks() -> dict[str, tuple[str, ...]]:
    """Task name -> its label strings, for every classification task with metrics."""
    out = {f"glue_{b}_v002": tuple(glue.GLUE[b][0]) for b in GLUE_CLASSIFICATION}
    out["glue_mnli_matched_v002"] = out["glue_mnli_mismatched_v002"] = out["glue_mnli_v002"]
    out.update(
        {f"super_glue_{b}_v102": tuple(glue.SUPER_GLUE[b][0]) for b in SUPER_GLUE_CLASSIFICATION}
    )
    return out


def _near_labels(labels: tuple[str, ...]) -> list[str]:
    """A label with a space around it, another case or a newline: not the label (t5 matches
    exactly)."""
    return [
        f" {labels[0]}",
        f"{labels[-1]} ",
        labels[0].upper(),
        labels[-1].capitalize(),
        f"{labels[0]}\n",
        f"{labels[0]} {labels[-1]}",
    ]


def _case(case_id, task, targets, predictions, examples=None, bytes_keys=(), seed=0):
    examples = examples or [{} for _ in targets]
    return {
        "id": case_id,
        "task": task,
        "targets": list(targets),
        "predictions": list(predictions),
        "examples": examples,
        "bytes_keys": list(bytes_keys),
        "seed": seed,
    }


def _classification_cases(rng: random.Random) -> list[dict]:
    cases = []
    for task, labels in _label_tasks().items():
        invalid = NON_LABELS + _near_labels(labels)

        def noisy(n, p_invalid):
            targets = [rng.choice(labels) for _ in range(n)]
            predictions = [
                rng.choice(invalid)
                if rng.random() < p_invalid
                else (t if rng.random() < 0.6 else rng.choice(labels))
                for t in targets
            ]
            return targets, predictions

        for i in range(3):
            cases.append(_case(f"{task}/random{i}", task, *noisy(rng.randint(5, 40), 0.25)))
        cases.append(_case(f"{task}/valid_only", task, *noisy(30, 0.0)))
        targets = [rng.choice(labels) for _ in range(20)]
        cases.append(
            _case(f"{task}/all_invalid", task, targets, [rng.choice(invalid) for _ in targets])
        )
        cases.append(
            _case(
                f"{task}/near_labels",
                task,
                targets,
                [rng.choice(_near_labels(labels)) for _ in targets],
            )
        )
        cases.append(_case(f"{task}/constant", task, targets, [labels[0]] * len(targets)))
        cases.append(_case(f"{task}/perfect", task, targets, targets))
        cases.append(
            _case(
                f"{task}/one_class_targets",
                task,
                [labels[0]] * 8,
                [labels[0], labels[-1], "?", labels[0], "", labels[-1], labels[0], labels[0]],
            )
        )
        cases.append(_case(f"{task}/one_example", task, [labels[-1]], ["nonsense"]))
    # CoLA with one invalid output: the T5 library's MCC keeps -1 as a third class.
    cases.append(
        _case(
            "glue_cola_v002/one_invalid",
            "glue_cola_v002",
            ["acceptable"] * 6 + ["unacceptable"] * 4,
            ["acceptable"] * 5 + ["unknown"] + ["unacceptable"] * 3 + ["acceptable"],
        )
    )
    return cases


def _stsb_cases(rng: random.Random) -> list[dict]:
    task = "glue_stsb_v002"
    grid = [f"{0.2 * i:.1f}" for i in range(26)]
    junk = ["", "three", "3,8", "3.8.", "-", "≈2"]
    cases = []
    for i in range(3):
        targets = [rng.choice(grid) for _ in range(rng.randint(5, 40))]
        predictions = [
            rng.choice(junk)
            if rng.random() < 0.15
            else (f"{rng.uniform(0, 5):.3f}" if rng.random() < 0.5 else rng.choice(grid))
            for _ in targets
        ]
        cases.append(_case(f"{task}/random{i}", task, targets, predictions))
    targets = [rng.choice(grid) for _ in range(12)]
    cases += [
        _case(f"{task}/ties", task, targets, [rng.choice(["1.0", "2.0", "3.0"]) for _ in targets]),
        _case(f"{task}/constant_prediction", task, targets, ["2.4"] * len(targets)),
        _case(f"{task}/constant_target", task, ["3.0"] * 6, ["1.0", "2.0", "3.0", "x", "4", "5"]),
        _case(f"{task}/all_invalid", task, targets, ["n/a"] * len(targets)),
        _case(f"{task}/perfect", task, targets, targets),
        _case(f"{task}/two_examples", task, ["1.0", "4.2"], ["0.4", "oops"]),
        _case(f"{task}/one_example", task, ["1.0"], ["2.0"]),
        _case(f"{task}/nan_inf_spelled", task, targets[:4], ["nan", "1.0", "inf", "2.0"]),
    ]
    return cases


def _multirc_cases(rng: random.Random) -> list[dict]:
    """Questions numbered across the whole split (as in SuperGLUE's MultiRC), each on one
    paragraph, with one example per answer option; and question ids that repeat across
    paragraphs."""
    task = "super_glue_multirc_v102"
    answers = ["False", "True"]
    cases = []

    def groups(n_questions, p_invalid, always_right=False, restart=False):
        targets, predictions, examples = [], [], []
        paragraph, first_of_paragraph = 0, 0
        for number in range(n_questions):
            if rng.random() < 0.5:
                paragraph, first_of_paragraph = paragraph + 1, number
            # restart: question ids counted within each paragraph, so they repeat across
            # paragraphs (the reference groups by idx/question alone).
            question = number - first_of_paragraph if restart else number
            for _ in range(rng.randint(1, 5)):
                target = rng.choice(answers)
                prediction = target if always_right or rng.random() < 0.7 else rng.choice(answers)
                if rng.random() < p_invalid:
                    prediction = rng.choice(NON_LABELS + _near_labels(tuple(answers)))
                targets.append(target)
                predictions.append(prediction)
                examples.append(
                    {"paragraph": paragraph, "question": question, "answer": len(examples)}
                )
        return targets, predictions, examples

    for i in range(4):
        cases.append(_case(f"{task}/random{i}", task, *groups(rng.randint(2, 12), 0.15)))
    for i in range(2):
        cases.append(
            _case(
                f"{task}/repeated_question_ids{i}",
                task,
                *groups(rng.randint(6, 12), 0.1, restart=True),
            )
        )
    cases.append(_case(f"{task}/valid_only", task, *groups(10, 0.0)))
    cases.append(_case(f"{task}/all_right", task, *groups(6, 0.0, always_right=True)))
    cases.append(_case(f"{task}/one_question", task, *groups(1, 0.3)))
    cases.append(_case(f"{task}/all_invalid", task, *groups(5, 1.0)))
    return cases


ENTITIES = [
    "Porto",
    "the Broncos",
    "U.S.",
    "Emmanuel Macron",
    "São Paulo",
    "Ḥalab",
    "O'Neill",
    "AC/DC",
    "an apple",
    "1990",
    "München",
    "Zoë",
    "北京",
    "Dr. Who",
    "Rock 'n' roll",
]
GUESSES = [
    "",
    "the",
    "a",
    "porto",
    "Porto.",
    "broncos",
    "The Broncos!",
    "US",
    "u s",
    "Macron",
    "emmanuel  macron",
    "sao paulo",
    "São",
    "halab",
    "oneill",
    "O Neill",
    "acdc",
    "AC DC",
    "apple",
    "an",
    "1990s",
    "in 1990",
    "munchen",
    "München!",
    "zoë",
    "北京",
    "Who",
    "rock n roll",
    "Rock 'n' roll",
    "¿Qué?",
    "…",
]


def _record_cases(rng: random.Random) -> list[dict]:
    """Each query repeated once per gold answer (as our and t5's ReCoRD preprocessors
    make it); only the first copy's prediction counts."""
    task = "super_glue_record_v102"
    cases = []

    def queries(n, n_answers=(1, 3)):
        targets, predictions, examples = [], [], []
        for query in range(n):
            golds = rng.sample(ENTITIES, rng.randint(*n_answers))
            for gold in golds or [""]:
                targets.append(gold)
                predictions.append(rng.choice(golds + GUESSES) if golds else rng.choice(GUESSES))
                examples.append({"answers": golds, "passage": query // 2, "query": query})
        return targets, predictions, examples

    for i in range(4):
        cases.append(
            _case(f"{task}/random{i}", task, *queries(rng.randint(2, 10)), bytes_keys=["answers"])
        )
    cases.append(_case(f"{task}/one_query", task, *queries(1), bytes_keys=["answers"]))
    cases.append(
        _case(f"{task}/query_without_answers", task, *queries(2, (0, 0)), bytes_keys=["answers"])
    )
    return cases


def _squad_cases(rng: random.Random) -> list[dict]:
    task = "squad_v010_allanswers"
    cases = []
    for i in range(4):
        targets, predictions, examples = [], [], []
        for _ in range(rng.randint(3, 30)):
            golds = rng.sample(ENTITIES, rng.randint(1, 3))
            targets.append(golds[0])
            predictions.append(rng.choice(golds + GUESSES))
            examples.append({"answers": golds})
        cases.append(
            _case(f"{task}/random{i}", task, targets, predictions, examples, bytes_keys=["answers"])
        )
    # An answer that normalises to nothing: EM counts the empty prediction, F1 does not.
    edge = [
        (["the"], ""),
        (["a"], "an"),
        (["the cat", "cat"], "the"),
        (["!!"], ""),
        (["Denver Broncos", "the Broncos"], "Broncos"),
        (["1990"], "in 1990 ."),
        (["U.S."], "us"),
        (["¿Qué?"], "¿qué"),
        (["café"], "cafe"),
    ]
    cases.append(
        _case(
            f"{task}/edge",
            task,
            [g[0] for g, _ in edge],
            [p for _, p in edge],
            [{"answers": g} for g, _ in edge],
            bytes_keys=["answers"],
        )
    )
    return cases


def _wsc_cases(rng: random.Random) -> list[dict]:
    task = "super_glue_wsc_v102_simple_eval"
    referents = [
        "the cat",
        "Mark",
        "Mark's hat",
        "the city councilmen",
        "Joan",
        "the trophy",
        "his sister",
        "Zoë",
    ]
    guesses = [
        "",
        "the",
        "a",
        "The Cat",
        "cat",
        "the  cat",
        "cat\tdog",
        "big cat",
        "Mark",
        "mark's",
        "Mark's hat",
        "hat",
        "Pete",
        "councilmen",
        "the city",
        "Joan!",
        "trophy",
        "suitcase",
        "her sister",
        "sister",
        "zoë",
        " the cat ",
        "his",
    ]
    cases = []
    for i in range(4):
        targets, predictions, examples = [], [], []
        for _ in range(rng.randint(5, 30)):
            referent = rng.choice(referents)
            examples.append({"label": rng.randint(0, 1), "targets_pretokenized": referent})
            targets.append(referent)
            predictions.append(rng.choice(guesses))
        cases.append(
            _case(
                f"{task}/random{i}",
                task,
                targets,
                predictions,
                examples,
                bytes_keys=["targets_pretokenized"],
            )
        )
    # An output with no words left (empty, only determiners) is not the referent, also where
    # the label says the candidate is not the referent.
    empty = ["", "the", "a", "  "]
    cases.append(
        _case(
            f"{task}/empty_outputs",
            task,
            ["the cat"] * 4,
            empty,
            [{"label": 0, "targets_pretokenized": "the cat"}] * 4,
            bytes_keys=["targets_pretokenized"],
        )
    )
    return cases


def _dpr_cases(rng: random.Random) -> list[dict]:
    task = "dpr_v001_simple"
    candidates = ["the cat", "Mark", "the trophy", "Zoë", "the city councilmen"]
    cases = []
    for i in range(2):
        targets = [rng.choice(candidates) for _ in range(rng.randint(3, 20))]
        predictions = [rng.choice(candidates + ["", "The cat", "mark", "zoë"]) for _ in targets]
        cases.append(_case(f"{task}/random{i}", task, targets, predictions))
    return cases


WORDS = [
    "the",
    "cat",
    "cats",
    "running",
    "runs",
    "ran",
    "sat",
    "on",
    "mat",
    "mats",
    "dog",
    "quickly",
    "quick",
    "ÉTÉ",
    "été",
    "naïve",
    "北京",
    "said",
    "says",
    ",",
    "'s",
    "U.S.",
    "20",
    "%",
    "(",
    ")",
    "-",
    "well-known",
    "organization",
    "organizations",
]


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _summary(rng: random.Random) -> str:
    """Sentences joined by " . ", as CNN/DM highlights are written (t5 splits them)."""
    return " . ".join(
        _sentence(rng, rng.randint(1, 12)) for _ in range(rng.randint(1, 4))
    ) + rng.choice([" .", "", "."])


def _rouge_cases(rng: random.Random) -> list[dict]:
    task = "cnn_dailymail_v002"
    cases = []
    for i in range(4):
        targets = [_summary(rng) for _ in range(rng.randint(1, 15))]
        predictions = [
            rng.choice([_summary(rng), t, t.replace("cats", "cat"), ""]) for t in targets
        ]
        cases.append(_case(f"{task}/random{i}", task, targets, predictions, seed=i))
    cases.append(
        _case(
            f"{task}/stems",
            task,
            ["The cats were running . They sat ."],
            ["the cat was run . they sit ."],
            seed=7,
        )
    )
    cases.append(_case(f"{task}/empty", task, ["a b c", ""], ["", ""], seed=3))
    return cases


def _bleu_cases(rng: random.Random) -> list[dict]:
    cases = []
    extra = ["Das ist gut.", "Ça va ?", "Îți mulțumesc!", "«Oui»", "1.000,50 €", "don't"]
    for task in WMT_TASKS:
        for i in range(3):
            targets = [
                _sentence(rng, rng.randint(1, 20)) + rng.choice(["", ".", " !"])
                for _ in range(rng.randint(1, 12))
            ]
            predictions = [rng.choice([t, _sentence(rng, rng.randint(0, 15)), ""]) for t in targets]
            cases.append(_case(f"{task}/random{i}", task, targets, predictions))
        cases.append(
            _case(
                f"{task}/punctuation_unicode",
                task,
                extra,
                [e.lower() for e in extra[:3]] + extra[3:],
            )
        )
        cases.append(_case(f"{task}/empty_predictions", task, extra[:2], ["", ""]))
    return cases


def _metric_cases(rng: random.Random) -> list[dict]:
    """Metric functions compared directly where a registered task does not reach them."""
    summaries = [(_summary(rng), _summary(rng)) for _ in range(8)]
    targets, predictions = [t for t, _ in summaries], [p for _, p in summaries]
    return [
        {
            "id": "rouge/use_stemmer",
            "metric": "rouge",
            "kwargs": {"use_stemmer": True},
            "targets": targets,
            "predictions": predictions,
            "seed": 11,
        },
        {
            "id": "rouge/rougeL_only",
            "metric": "rouge",
            "kwargs": {"score_keys": ["rougeL"]},
            "targets": targets,
            "predictions": predictions,
            "seed": 12,
        },
        {
            "id": "bleu/several_references",
            "metric": "bleu",
            "kwargs": {},
            "targets": [
                ["the cat sat on the mat today", "a cat sat on a mat today"],
                ["the dog ran far away from home", "a dog ran away from the house"],
            ],
            "predictions": ["the cat sat on a mat today", "the dog ran away from home"],
            "seed": 0,
        },
        {
            "id": "bleu/13a",
            "metric": "bleu",
            "kwargs": {"tokenizer": "13a"},
            "targets": targets,
            "predictions": predictions,
            "seed": 0,
        },
        {
            "id": "squad/no_gold_answer",
            "metric": "squad",
            "kwargs": {},
            "targets": [["x"], []],
            "predictions": ["x", ""],
            "seed": 0,
        },
        {
            "id": "accuracy/strings",
            "metric": "accuracy",
            "kwargs": {},
            "targets": ["a", "b", "", "Zoë"],
            "predictions": ["a", "B", "", "zoë"],
            "seed": 0,
        },
    ]


def _all_task_cases() -> list[dict]:
    rng = random.Random(20240611)
    return (
        _classification_cases(rng)
        + _stsb_cases(rng)
        + _multirc_cases(rng)
        + _record_cases(rng)
        + _squad_cases(rng)
        + _wsc_cases(rng)
        + _dpr_cases(rng)
        + _rouge_cases(rng)
        + _bleu_cases(rng)
    )


TASK_CASES = _all_task_cases()
METRIC_CASES = _metric_cases(random.Random(7))


# --------------------------------------------------------------- the two sides' examples
def _reference_example(task: str, raw: dict) -> dict:
    """The example as t5's postprocessors read it (seqio flattens `idx` with '/')."""
    if task.startswith("super_glue_multirc"):
        return {
            "idx/paragraph": raw["paragraph"],
            "idx/question": raw["question"],
            "idx/answer": raw["answer"],
        }
    if task.startswith("super_glue_record"):
        return {"answers": raw["answers"], "idx/passage": raw["passage"], "idx/query": raw["query"]}
    return dict(raw)


def _our_example(task: str, raw: dict) -> dict:
    """The example as our preprocessors write it (t5x_like.families.t5.text_to_text), bytes as in a
    numpy example."""

    def encode(v):
        return [x.encode() for x in v] if isinstance(v, list) else v.encode()

    if task.startswith("super_glue_multirc"):
        return {
            "idx_paragraph": np.int32(raw["paragraph"]),
            "idx_question": np.int32(raw["question"]),
        }
    if task.startswith("super_glue_record"):
        return {
            "answers": encode(raw["answers"]),
            "idx_passage": np.int32(raw["passage"]),
            "idx_query": np.int32(raw["query"]),
        }
    out = dict(raw)
    if "answers" in out:
        out["answers"] = encode(out["answers"])
    if "targets_pretokenized" in out:
        out["targets_pretokenized"] = encode(out["targets_pretokenized"])
    return out


def _as_partition(targets: list) -> list:
    """A grouped target's "group" replaced by the index of its group's first example: the
    metric depends on which examples share a group, not on how the group is spelled."""
    first: dict = {}
    out = []
    for i, target in enumerate(targets):
        if isinstance(target, dict) and "group" in target:
            key = repr(target["group"])
            target = {**target, "group": first.setdefault(key, i)}
        out.append(target)
    return out


def _ours_task(case: dict) -> dict:
    task = seqio.get_mixture_or_task(case["task"])
    examples = [_our_example(case["task"], ex) for ex in case["examples"]]
    try:
        targets = [
            task.postprocess_fn(t, example=ex, is_target=True)
            for t, ex in zip(case["targets"], examples)
        ]
        predictions = [
            task.postprocess_fn(p, example=ex, is_target=False)
            for p, ex in zip(case["predictions"], examples)
        ]
        np.random.seed(case["seed"])
        scores: dict = {}
        for metric_fn in task.metric_fns:
            scores.update(metric_fn(targets, predictions))
    except Exception as error:  # noqa: BLE001 - a failure is compared with the reference's
        return {"error": type(error).__name__}
    return {
        "metrics": {k: float(v) for k, v in scores.items()},
        "targets": jsonable(targets),
        "predictions": jsonable(predictions),
    }


def _ours_metric(case: dict) -> dict:
    try:
        np.random.seed(case["seed"])
        scores = getattr(metrics, case["metric"])(
            case["targets"], case["predictions"], **case["kwargs"]
        )
    except Exception as error:  # noqa: BLE001 - a failure is compared with the reference's
        return {"error": type(error).__name__}
    return {"metrics": {k: float(v) for k, v in scores.items()}}


@pytest.fixture(scope="module")
def reference():
    payload = {
        "task_cases": [
            {**c, "examples": [_reference_example(c["task"], ex) for ex in c["examples"]]}
            for c in TASK_CASES
        ],
        "metric_cases": METRIC_CASES,
    }
    return run_oracle("t5_metrics", payload)


def _same_number(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _same_value(a, b) -> bool:
    """Equal, NaN equal to NaN (a postprocessed STS-B output may be NaN on both sides)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _assert_same(ours: dict, theirs: dict) -> None:
    assert ("error" in ours) == ("error" in theirs), (ours, theirs)
    if "error" in theirs:
        assert ours["error"] == theirs["error"]
        return
    assert list(ours["metrics"]) == list(theirs["metrics"]), (ours["metrics"], theirs["metrics"])
    different = {
        k: (v, theirs["metrics"][k])
        for k, v in ours["metrics"].items()
        if not _same_number(v, theirs["metrics"][k])
    }
    assert not different, f"ours vs t5: {different}"
    for side in ("targets", "predictions"):
        if side in theirs:
            ours_side, theirs_side = _as_partition(ours[side]), _as_partition(theirs[side])
            assert _same_value(ours_side, theirs_side), (side, ours_side, theirs_side)


def test_every_task_with_metrics_is_covered():
    """Each task we register under a T5-library name with metrics has cases here."""
    covered = {c["task"] for c in TASK_CASES}
    named_like_t5 = ("glue_", "super_glue_", "dpr_", "squad_v010", "cnn_dailymail", "wmt")
    ours = {
        name
        for name in seqio.TaskRegistry.names()
        if name.startswith(named_like_t5) and seqio.get_mixture_or_task(name).metric_fns
    }
    assert ours - covered == set()


@pytest.mark.parametrize("case", TASK_CASES, ids=[c["id"] for c in TASK_CASES])
def test_task_postprocessing_and_metrics_equal_t5(case, reference):
    _assert_same(_ours_task(case), reference["task_cases"][case["id"]])


@pytest.mark.parametrize("case", METRIC_CASES, ids=[c["id"] for c in METRIC_CASES])
def test_metric_functions_equal_t5(case, reference):
    _assert_same(_ours_metric(case), reference["metric_cases"][case["id"]])
