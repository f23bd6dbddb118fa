"""BERT's fine-tuning inputs and decoding against Google BERT's own code (bert-tensorflow
1.0.4, run in its own process: tests/oracles/bert_finetune.py): pair truncation
(`run_classifier._truncate_seq_pair`), [CLS]/[SEP] framing (`convert_single_example`), SQuAD
windows, answer positions and max context (`read_squad_examples`,
`convert_examples_to_features`) and end-to-end SQuAD decoding (`write_predictions`); plus
hand-derived cases (each with its derivation) for the v2.0 threshold search and CoNLL entity
F1, and the errors for a head or vocabulary that does not fit the task."""

import numpy as np
import pytest
import tensorflow as tf

from t5x_like import metrics
from t5x_like.data.wordpiece import WordPieceVocabulary
from t5x_like.errors import ConfigError
from t5x_like.families.bert import preprocessors as bp
from t5x_like.families.bert import squad_eval, squad_spans
from tests.oracle import run_oracle

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
    "leader",
    "was",
    "john",
    "smith",
    "(",
    "1895",
    "-",
    "1943",
    ")",
    "japan",
    "##ese",
    "is",
    "big",
]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(WORDS) + "\n")
    return WordPieceVocabulary(str(path))


CONTEXT = "the cat sat on the mat a dog ran far away"
BUDGETS, LENGTHS = range(1, 14), range(0, 16)
# (text a, text b or None, max_seq_length) framed by both sides
CLASSIFIER_CASES = [
    ("the cat sat", "a dog ran", 16),
    ("the cat sat on the mat", "dogs ran", 9),
    ("the cat sat on the mat .", None, 6),
    ("the cat sat", "", 8),
]
# (context, answer, its character offset): answers inside a longer word or with punctuation
# (the reference narrows them to their own pieces), and one its offset does not hold (the
# reference drops the example).
ANSWER_SPAN_CASES = [
    ("the leader was john smith (1895-1943).", "1895", 27),
    ("the leader was john smith (1895-1943).", "smith (1895", 20),
    ("japanese is big .", "japan", 0),
    ("the cat sat on the mat.", "dog", 4),
]


def _squad_case(answer, is_training, predict=None, version_2=False):
    example = {
        "id": "q",
        "context": CONTEXT,
        "question": "who ran",
        "is_impossible": False,
        "answers": []
        if answer is None
        else [{"text": answer, "answer_start": CONTEXT.index(answer)}],
    }
    case = {
        "examples": [example],
        "is_training": is_training,
        "version_2": version_2,
        "max_seq_length": 11,
        "doc_stride": 3,
        "max_query_length": 64,
    }
    return {**case, "predict": predict} if predict else case


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Google BERT's output on every case of this module, from one oracle run."""
    ids = {w: i for i, w in enumerate(WORDS)}
    payload = {
        "dir": str(tmp_path_factory.mktemp("bert_reference")),
        "vocab": WORDS,
        "truncate": [[a, b, n] for n in BUDGETS for a in LENGTHS for b in LENGTHS],
        "classifier": [{"a": a, "b": b, "max_seq_length": n} for a, b, n in CLASSIFIER_CASES],
        "squad": [
            _squad_case("dog ran", is_training=True),
            _squad_case(
                None, False, {"start_id": ids["ran"], "end_id": ids["away"], "cls_id": ids["[CLS]"]}
            ),
            _squad_case(
                None,
                False,
                {
                    "start_id": ids["[CLS]"],
                    "end_id": ids["[CLS]"],
                    "cls_id": ids["[CLS]"],
                    "null_threshold": 0.0,
                },
                version_2=True,
            ),
        ]
        + [
            {
                "examples": [
                    {
                        "id": "q",
                        "context": context,
                        "question": "who ran",
                        "is_impossible": False,
                        "answers": [{"text": answer, "answer_start": start}],
                    }
                ],
                "is_training": True,
                "version_2": False,
                "max_seq_length": 32,
                "doc_stride": 128,
                "max_query_length": 64,
            }
            for context, answer, start in ANSWER_SPAN_CASES
        ],
    }
    return run_oracle("bert_finetune", payload)


def test_pair_truncation_equals_the_reference(reference):
    cases = [(a, b, n) for n in BUDGETS for a in LENGTHS for b in LENGTHS]
    for (len_a, len_b, budget), want in zip(cases, reference["truncate"]):
        got = bp.truncated_pair_lengths(tf.constant(len_a), tf.constant(len_b), budget)
        assert [int(x) for x in got] == want, (len_a, len_b, budget)


def _frame(vocab, example, keys, length):
    ds = tf.data.Dataset.from_tensors(example)
    out = bp.frame_pair(vocab, keys)(ds, {"inputs": length})
    return next(out.as_numpy_iterator())


def _padded(values, length):
    return list(values) + [0] * (length - len(values))


def test_sentence_pair_is_framed_with_cls_sep_and_segments(vocab, reference):
    ex = _frame(vocab, {"a": "the cat sat", "b": "a dog ran", "label": 1}, ("a", "b"), 16)
    # The paper's format (Figure 2): [CLS] A [SEP] B [SEP], segment 0 through the first [SEP].
    ids = {w: i for i, w in enumerate(WORDS)}
    want = [ids[w] for w in ["[CLS]", "the", "cat", "sat", "[SEP]", "a", "dog", "ran", "[SEP]"]]
    assert ex["inputs"].tolist() == want
    assert ex["segment_ids"].tolist() == [0] * 5 + [1] * 4
    assert ex["label"] == 1.0
    # Too long (budget 9 - 3 = 6 for A's 6 pieces and B's 3: "dog ##s ran"): the longer A
    # loses its last tokens until both are 3.
    cut = _frame(vocab, {"a": "the cat sat on the mat", "b": "dogs ran", "label": 0}, ("a", "b"), 9)
    assert len(cut["inputs"]) == 9
    assert [WORDS[i] for i in cut["inputs"]] == [
        "[CLS]",
        "the",
        "cat",
        "sat",
        "[SEP]",
        "dog",
        "##s",
        "ran",
        "[SEP]",
    ]
    for got, (_, _, length), ref in zip((ex, cut), CLASSIFIER_CASES, reference["classifier"]):
        assert _padded(got["inputs"].tolist(), length) == ref["input_ids"]
        assert _padded(got["segment_ids"].tolist(), length) == ref["segment_ids"]


def test_single_sentence_keeps_one_segment(vocab, reference):
    ex = _frame(vocab, {"s": "the cat sat on the mat .", "label": 0}, ("s",), 6)
    # max_seq_length 6 leaves 4 pieces between [CLS] and [SEP]
    assert [WORDS[i] for i in ex["inputs"]] == ["[CLS]", "the", "cat", "sat", "on", "[SEP]"]
    assert ex["segment_ids"].tolist() == [0] * 6
    ref = reference["classifier"][2]
    assert ex["inputs"].tolist() == ref["input_ids"]
    assert ex["segment_ids"].tolist() == ref["segment_ids"]
    assert ref["input_mask"] == [1] * 6


def _assert_features_equal(ours, theirs):
    """Our SQuAD windows equal the reference's `InputFeatures`: ids, segments, answer
    positions, the word of each context token and which tokens are in their max context."""
    assert len(ours) == len(theirs)
    for f, ref in zip(ours, theirs):
        assert f.input_ids == ref["input_ids"]
        assert f.segment_ids == ref["segment_ids"]
        if ref["start_position"] is not None:  # the reference sets positions when training
            assert (f.start_position, f.end_position) == (
                ref["start_position"],
                ref["end_position"],
            )
        assert f.token_to_word == {int(k): v for k, v in ref["token_to_orig_map"].items()}
        assert {int(k): bool(f.valid[int(k)]) for k in ref["token_is_max_context"]} == {
            int(k): v for k, v in ref["token_is_max_context"].items()
        }
        assert sorted(np.flatnonzero(f.in_context)) == sorted(
            int(k) for k in ref["token_to_orig_map"]
        )
        assert not f.valid[
            [i for i in range(len(f.valid)) if str(i) not in ref["token_is_max_context"]]
        ].any()


def test_squad_windows_positions_and_max_context(vocab, reference):
    context = CONTEXT
    answer_start = context.index("dog ran")
    words, features = bp.squad_features(
        vocab, context, "who ran", ("dog ran", answer_start), max_seq_length=11, doc_stride=3
    )
    # 11 context pieces; room = 11 - 2 (query) - 3 = 6 per window, stride 3.
    assert [len(f.input_ids) for f in features] == [11, 11, 10]
    assert [f.token_to_word[4] for f in features] == [0, 3, 6]  # windows start at 0, 3, 6
    # The answer (words 7-8) is inside windows 2 and 3 only.
    spans = [(f.start_position, f.end_position) for f in features]
    assert spans[0] == (0, 0)
    for f, (s, e) in zip(features[1:], spans[1:]):
        assert [words[f.token_to_word[i]] for i in (s, e)] == ["dog", "ran"]
    # Each context word is "valid" (max context) in exactly one window.
    owners = {}
    for index, f in enumerate(features):
        for position, word in f.token_to_word.items():
            if f.valid[position]:
                assert word not in owners
                owners[word] = index
    assert sorted(owners) == list(range(len(words)))
    ref = reference["squad"][0]
    assert ref["num_examples"] == 1
    _assert_features_equal(features, ref["features"])
    # Without an answer (evaluation) the windows are the same.
    _, plain = bp.squad_features(vocab, context, "who ran", None, 11, 3)
    _assert_features_equal(plain, reference["squad"][1]["features"])


class _PointingModel:
    """A stand-in span model that puts its start/end logits on given piece ids."""

    FEATURES = ("input_ids", "segment_ids", "input_mask", "start_position", "end_position")

    def __init__(self, start_id, end_id):
        self.start_id, self.end_id = start_id, end_id

    def predict(self, params, batch):
        ids = batch["input_ids"]
        context = (batch["segment_ids"] == 1) | (ids == WORDS.index("[CLS]"))
        return ((ids == self.start_id) & context) * 10.0, ((ids == self.end_id) & context) * 10.0


def test_squad_decoding_recovers_the_answer_text_across_windows(vocab, reference):
    """The same stand-in model scores our windows and the reference's (the oracle applies
    `_PointingModel`'s rule to its own features); `write_predictions` decodes theirs."""
    ids = {w: i for i, w in enumerate(WORDS)}
    examples = [{"context": CONTEXT, "question": "who ran"}]
    # "ran" has its most context in the third window (start 6), where the span ends at
    # "away"; the windows before score nothing there.
    model = _PointingModel(ids["ran"], ids["away"])
    answers = squad_eval.predict_answers(
        model, None, vocab, examples, max_seq_length=11, batch_size=2, doc_stride=3
    )
    assert answers == [reference["squad"][1]["predictions"]["q"]] == ["ran far away"]
    assert metrics.squad([["ran far away", "a dog"]], answers) == {"em": 100.0, "f1": 100.0}
    # v2.0: a null score that beats the best span by more than tau means "no answer".
    model = _PointingModel(ids["[CLS]"], ids["[CLS]"])
    v2 = reference["squad"][2]
    assert (
        squad_eval.predict_answers(model, None, vocab, examples, 11, 2, 3, null_threshold=0.0)
        == [v2["predictions"]["q"]]
        == [""]
    )
    [(_, diff)] = squad_eval.best_answers(model, None, vocab, examples, 11, 2, 3)
    assert diff == pytest.approx(v2["scores_diff"]["q"])  # null 10 + 10 vs a span of 0
    assert metrics.squad_v2([[]], [""]) == {"em": 100.0, "f1": 100.0}


def test_null_threshold_search_follows_the_official_v2_script():
    # Example: (null - best span score, has a gold answer, F1 of its best span)
    diffs = [-2.0, -1.0, 0.5, 3.0]
    has_answer = [True, False, True, False]
    span_f1 = [1.0, 0.0, 0.5, 0.0]
    # tau below -2: all null -> 2 right of 4 (the unanswerable ones) = 50%
    # tau in [-2, -1): ex0 answers (+1.0) -> 75%;  [-1, 0.5): ex1 answers (-1) -> 50%
    # [0.5, 3): ex2 answers (+0.5) -> 62.5%;  >= 3: ex3 answers (-1) -> 37.5%
    assert squad_spans.best_null_threshold(diffs, has_answer, span_f1) == (-2.0, 75.0)
    assert squad_spans.best_null_threshold([1.0], [False], [0.0]) == (0.0, 100.0)


def test_conll_f1_counts_whole_entities():
    tags = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")
    f1 = metrics.conll_ner_f1(tags)
    gold = [[1, 2, 0, 3], [0, 3, 4]]
    # one entity right (PER), one with the wrong extent (LOC cut short), one right (LOC)
    pred = [[1, 2, 0, 0], [0, 3, 0]]
    out = f1(gold, pred)
    # gold 3 entities, predicted 2 (PER, LOC[1:2] wrong) -> correct 1
    assert out["precision"] == pytest.approx(50.0)
    assert out["recall"] == pytest.approx(100.0 / 3)
    assert out["f1"] == pytest.approx(40.0)
    # an I- tag that starts a chunk counts as its beginning (conlleval)
    assert f1([[2, 2]], [[1, 2]])["f1"] == pytest.approx(100.0)


def test_head_that_does_not_fit_the_task_is_refused():
    from t5x_like import (
        input_pipeline,
        tasks,  # noqa: F401
    )
    from t5x_like.families.bert import model as bert_models
    from t5x_like.families.bert import network as bert

    model = bert_models.BertClassifierModel(bert.BertConfig(vocab_size=4096), num_labels=2)
    with pytest.raises(ConfigError, match="3 labels.*num_labels = 3"):
        input_pipeline.check_num_labels(input_pipeline.resolve_task("bert_glue_mnli"), model)
    with pytest.raises(ConfigError, match="1 \\(regression\\)"):
        input_pipeline.check_num_labels(input_pipeline.resolve_task("bert_glue_stsb"), model)


def test_vocabulary_of_another_size_than_the_model_is_refused(tmp_path):
    import gin

    from t5x_like import (
        input_pipeline,
        tasks,  # noqa: F401
    )

    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(WORDS) + "\n")
    gin.bind_parameter("bert_vocab_path.path", str(path))
    task = input_pipeline.resolve_task("bert_glue_sst2")
    with pytest.raises(ConfigError, match=f"{len(WORDS)} pieces.*30522 token embeddings"):
        input_pipeline.check_vocabulary(task, 30522)
    input_pipeline.check_vocabulary(task, len(WORDS))


def test_offline_word_order_examples_are_balanced_and_fixed():
    from t5x_like import tasks
    from t5x_like.tasks import offline

    def examples():
        ds = tasks.bert.word_order_examples(offline.OFFLINE_SOURCE.get_dataset("validation"))
        return [(ex["sentence"].decode(), int(ex["label"])) for ex in ds.as_numpy_iterator()]

    first = examples()
    assert first == examples() and len(first) > 200
    assert 0.4 < np.mean([label for _, label in first]) < 0.6
    originals = {s for s, label in first if label == 1}
    for sentence, label in first:
        if label == 0:  # the same words, in another order
            assert sentence not in originals and len(sentence.split()) >= 6


def test_an_empty_second_sentence_frames_a_single_one(vocab, reference):
    """run_classifier frames an empty text_b as a single sentence (`if tokens_b:`)."""
    ex = _frame(vocab, {"a": "the cat sat", "b": "", "label": 0}, ("a", "b"), 8)
    ref = reference["classifier"][3]
    assert _padded(ex["inputs"].tolist(), 8) == ref["input_ids"]
    assert _padded(ex["segment_ids"].tolist(), 8) == ref["segment_ids"]


@pytest.mark.parametrize("case", range(len(ANSWER_SPAN_CASES)))
def test_squad_answer_spans_are_the_references(vocab, reference, case):
    """Answer positions narrowed to the answer's own pieces (run_squad._improve_answer_span),
    and an answer its offset does not hold dropped (read_squad_examples)."""
    context, answer, start = ANSWER_SPAN_CASES[case]
    assert context[start:].startswith(answer) or case == 3
    _, features = bp.squad_features(
        vocab, context, "who ran", (answer, start), max_seq_length=32, doc_stride=128
    )
    ref = reference["squad"][3 + case]
    assert len(features) == len(ref["features"]) == (0 if case == 3 else 1)
    _assert_features_equal(features, ref["features"])
