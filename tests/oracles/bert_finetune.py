"""Oracle: Google BERT's fine-tuning data code (bert-tensorflow 1.0.4): `run_classifier.py`
(`convert_single_example`, `_truncate_seq_pair`) and `run_squad.py` (`read_squad_examples`,
`convert_examples_to_features`, `_check_is_max_context`, `write_predictions`).

Payload (every key optional but "dir"):
  {"dir": a folder to write in, "vocab": vocab.txt's lines (lower-cased FullTokenizer),
   "truncate": [[len_a, len_b, budget]],
   "classifier": [{"a": str, "b": str or null, "max_seq_length": n}],
   "squad": [{"examples": [{"id", "context", "question", "answers": [{"text",
              "answer_start"}], "is_impossible"}], "is_training": bool, "version_2": bool,
              "max_seq_length": n, "doc_stride": n, "max_query_length": n,
              "predict": {"logits" or "start_id", "end_id", "cls_id"; "n_best",
                          "max_answer_length", "null_threshold"} or absent}],
   "max_context": [{"spans": [[start, length]], "num_tokens": n}]}

Returns {"truncate": [[len_a, len_b]], "classifier": [{"input_ids", "input_mask",
"segment_ids"}], "squad": [{"num_examples": n, "features": [{"example_index", "input_ids",
"segment_ids" (both cut to the feature's real tokens), "start_position", "end_position",
"token_to_orig_map", "token_is_max_context"}], "predictions": {id: text},
"scores_diff": {id: float}}], "max_context": [[[bool per position] per span]]}.

"predict" decodes with `write_predictions` either the logits it gives ("logits": [[start
logits, end logits] per feature, in the reference's feature order]) or those of a pointing
stand-in for a model ("start_id", "end_id", "cls_id"), the same rule the tests' stand-in
applies to our features: start logit 10 on tokens equal to `start_id`, end logit 10
on tokens equal to `end_id`, both only where segment_ids is 1 or the token is [CLS] (else 0),
and decodes them with `write_predictions` (`null_threshold` set: SQuAD v2.0 decoding).

run_classifier.py and run_squad.py import `modeling` and `optimization`, which need
TensorFlow 1's contrib and are not used by the data functions: stand-in empty modules are put
in their place. Both scripts define the same absl flags, so run_classifier's are removed again
before run_squad is imported.
"""

import collections
import json
import os
import sys
import types

from tests.oracle import oracle_main


def _import_reference():
    for name in ("bert.modeling", "bert.optimization"):
        sys.modules.setdefault(name, types.ModuleType(name))
    from absl import flags
    from bert import tokenization

    before = set(flags.FLAGS)  # tokenization's own flag (--preserve_unused_tokens) stays
    from bert import run_classifier

    for name in set(flags.FLAGS) - before:
        delattr(flags.FLAGS, name)
    from bert import run_squad

    flags.FLAGS.mark_as_parsed()
    return run_classifier, run_squad, tokenization, flags.FLAGS


def _truncate(run_classifier, case):
    len_a, len_b, budget = case
    a, b = list(range(len_a)), list(range(len_b))
    run_classifier._truncate_seq_pair(a, b, budget)
    return [len(a), len(b)]


def _classify(run_classifier, tokenizer, case):
    example = run_classifier.InputExample(
        guid="x", text_a=case["a"], text_b=case.get("b"), label="0"
    )
    feature = run_classifier.convert_single_example(
        10, example, ["0"], case["max_seq_length"], tokenizer
    )
    return {
        "input_ids": feature.input_ids,
        "input_mask": feature.input_mask,
        "segment_ids": feature.segment_ids,
    }


def _squad_file(folder, index, examples):
    path = os.path.join(folder, f"reference_squad_{index}.json")
    qas = [
        {
            "id": ex["id"],
            "question": ex["question"],
            "answers": ex["answers"],
            "is_impossible": ex.get("is_impossible", False),
        }
        for ex in examples
    ]
    # one paragraph per question: the examples may have different contexts
    data = [
        {"title": "t", "paragraphs": [{"context": ex["context"], "qas": [q]}]}
        for ex, q in zip(examples, qas)
    ]
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"data": data, "version": "x"}, f)
    return path


def _pointing_logits(feature, rule):
    logits = []
    for target in (rule["start_id"], rule["end_id"]):
        logits.append(
            [
                10.0 if (token == target and (segment == 1 or token == rule["cls_id"])) else 0.0
                for token, segment in zip(feature.input_ids, feature.segment_ids)
            ]
        )
    return logits


def _squad(run_squad, tokenizer, flag_values, folder, index, case):
    flag_values.version_2_with_negative = bool(case.get("version_2", False))
    examples = run_squad.read_squad_examples(
        _squad_file(folder, index, case["examples"]), case["is_training"]
    )
    features = []
    run_squad.convert_examples_to_features(
        examples,
        tokenizer,
        case["max_seq_length"],
        case["doc_stride"],
        case["max_query_length"],
        case["is_training"],
        features.append,
    )
    out = {
        "num_examples": len(examples),
        "features": [
            {
                "example_index": f.example_index,
                "input_ids": f.input_ids[: len(f.tokens)],
                "segment_ids": f.segment_ids[: len(f.tokens)],
                "start_position": f.start_position,
                "end_position": f.end_position,
                "token_to_orig_map": {str(k): v for k, v in f.token_to_orig_map.items()},
                "token_is_max_context": {
                    str(k): bool(v) for k, v in f.token_is_max_context.items()
                },
            }
            for f in features
        ],
    }
    rule = case.get("predict")
    if rule:
        threshold = rule.get("null_threshold")
        flag_values.version_2_with_negative = threshold is not None
        flag_values.null_score_diff_threshold = threshold if threshold is not None else 0.0
        flag_values.verbose_logging = False
        given = rule.get("logits")  # [[start_logits, end_logits] per feature], or the rule
        results = [
            run_squad.RawResult(f.unique_id, *(given[i] if given else _pointing_logits(f, rule)))
            for i, f in enumerate(features)
        ]
        files = [
            os.path.join(folder, f"reference_{name}_{index}.json")
            for name in ("predictions", "nbest", "null_odds")
        ]
        run_squad.write_predictions(
            examples,
            features,
            results,
            rule.get("n_best", 20),
            rule.get("max_answer_length", 30),
            True,
            *files,
        )
        with open(files[0], encoding="utf-8") as f:
            out["predictions"] = json.load(f, object_pairs_hook=collections.OrderedDict)
        if threshold is not None:
            with open(files[2], encoding="utf-8") as f:
                out["scores_diff"] = json.load(f)
    return out


def _max_context(run_squad, case):
    span = collections.namedtuple("DocSpan", ["start", "length"])
    spans = [span(start, length) for start, length in case["spans"]]
    return [
        [
            bool(run_squad._check_is_max_context(spans, index, position))
            for position in range(case["num_tokens"])
        ]
        for index in range(len(spans))
    ]


def compute(payload):
    run_classifier, run_squad, tokenization, flag_values = _import_reference()
    folder = payload["dir"]
    tokenizer = None
    if "vocab" in payload:
        vocab_file = os.path.join(folder, "reference_vocab.txt")
        with open(vocab_file, "w", encoding="utf-8") as f:
            f.write("\n".join(payload["vocab"]) + "\n")
        tokenizer = tokenization.FullTokenizer(vocab_file=vocab_file, do_lower_case=True)
    return {
        "truncate": [_truncate(run_classifier, c) for c in payload.get("truncate", [])],
        "classifier": [
            _classify(run_classifier, tokenizer, c) for c in payload.get("classifier", [])
        ],
        "squad": [
            _squad(run_squad, tokenizer, flag_values, folder, i, c)
            for i, c in enumerate(payload.get("squad", []))
        ],
        "max_context": [_max_context(run_squad, c) for c in payload.get("max_context", [])],
    }


if __name__ == "__main__":
    oracle_main(compute)
