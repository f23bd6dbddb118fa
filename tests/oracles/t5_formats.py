"""Oracle: the T5 library's registered tasks (t5.data.tasks, t5 0.9.4) turn raw examples into
`inputs` / `targets` strings, and their postprocessors read predictions.

Payload: {"spm_path": a local file name for t5's default vocabulary (never read),
          "cases": [{"id", "task", "spec", "examples", "predictions"?}]}.
For each case the raw examples (typed by `spec`, the TFDS dataset's own tensor specs) go
through the registered task's preprocessors up to its tokenize step; with `predictions`,
each output example and prediction also goes through the task's `postprocess_fn`.
Result: {"names": every task name the library registers,
         "tails": {task: names of the preprocessors from tokenize on},
         "outputs": {case id: [{"inputs", "targets", "answers"?}]},
         "postprocessed": {case id: [{"target", "predictions"}]}}.

The helpers below (datasets from JSON, the text steps of a task, JSON of numpy values) are
also what the test runs on our tasks, so both sides are fed and read the same way.
"""

from __future__ import annotations

import itertools
import sys
from typing import Any, Mapping

import numpy as np
import tensorflow as tf

TEXT_KEYS = ("inputs", "targets", "answers")


def spec_to_json(spec: Any) -> Any:
    """A TFDS `get_tensor_spec()` tree as JSON ({"dtype", "shape"} leaves)."""
    if isinstance(spec, Mapping):
        return {k: spec_to_json(v) for k, v in spec.items()}
    return {"dtype": spec.dtype.name, "shape": spec.shape.as_list()}


def _is_leaf(spec: Mapping[str, Any]) -> bool:
    return set(spec) == {"dtype", "shape"} and isinstance(spec["dtype"], str)


def _signature(spec: Mapping[str, Any]) -> Any:
    if _is_leaf(spec):
        return tf.TensorSpec(spec["shape"], tf.dtypes.as_dtype(spec["dtype"]))
    return {k: _signature(v) for k, v in spec.items()}


def _default(spec: Mapping[str, Any]) -> Any:
    """The value of a feature an example leaves out: empty text, 0, or an empty sequence."""
    if _is_leaf(spec):
        if spec["shape"]:
            return []
        return "" if spec["dtype"] == "string" else 0
    return {k: _default(v) for k, v in spec.items()}


def complete_example(example: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    """The example with the features it leaves out filled in (`_default`)."""
    unknown = set(example) - set(spec)
    if unknown:
        raise KeyError(f"features {sorted(unknown)} are not in the dataset's {sorted(spec)}")
    out = {}
    for key, sub in spec.items():
        if key not in example:
            out[key] = _default(sub)
        elif _is_leaf(sub):
            out[key] = example[key]
        else:
            out[key] = complete_example(example[key], sub)
    return out


def to_dataset(examples: list[Mapping[str, Any]], spec: Mapping[str, Any]) -> tf.data.Dataset:
    """The examples as TFDS would decode them (its dtypes and shapes); missing features are
    empty."""
    rows = [complete_example(ex, spec) for ex in examples]
    return tf.data.Dataset.from_generator(lambda: iter(rows), output_signature=_signature(spec))


def _is_tokenize(step: Any) -> bool:
    import seqio

    return step is seqio.preprocessors.tokenize or (
        getattr(step, "func", None) is seqio.preprocessors.tokenize
    )


def text_steps(task: Any) -> list:
    """The task's preprocessors before tokenizing: the ones that write the text."""
    return list(itertools.takewhile(lambda p: not _is_tokenize(p), task.preprocessors))


def step_names(steps: list) -> list[str]:
    names = []
    for step in steps:
        fn = getattr(step, "func", step)
        names.append(getattr(fn, "__name__", type(fn).__name__))
    return names


def tail_names(task: Any) -> list[str]:
    """What the task does from tokenizing on."""
    return step_names(task.preprocessors[len(text_steps(task)) :])


def text_examples(
    task: Any, examples: list[Mapping[str, Any]], spec: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The task's own text preprocessors (as seqio applies them) on the raw examples."""
    ds = task._preprocess_dataset(to_dataset(examples, spec), text_steps(task))
    return list(ds.as_numpy_iterator())


def jsonable(value: Any) -> Any:
    """numpy / bytes / tuples as JSON; bytes as text, undecodable bytes kept as surrogates."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if isinstance(value, np.ndarray):
        return [jsonable(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return jsonable(value.item())
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def texts(example: Mapping[str, Any]) -> dict[str, Any]:
    return {k: jsonable(example[k]) for k in TEXT_KEYS if k in example}


def postprocess(task: Any, example: Mapping[str, Any], predictions: list[str]) -> dict:
    """The task's postprocessor on the example's target and on each prediction, with the
    example as seqio's evaluator passes it (`targets_pretokenized` beside the features)."""
    example = dict(example, targets_pretokenized=example["targets"])
    fn = task.postprocess_fn
    return {
        "target": jsonable(fn(example["targets"], example=example, is_target=True)),
        "predictions": [jsonable(fn(p, example=example, is_target=False)) for p in predictions],
    }


def compute(payload: dict) -> dict:
    import t5.data  # noqa: F401  (t5.data.utils is importable only after it)

    sys.modules["t5.data.utils"].DEFAULT_SPM_PATH = payload["spm_path"]
    import seqio
    import t5.data.mixtures  # noqa: F401  (registers every task and mixture)

    outputs, postprocessed, tails = {}, {}, {}
    for case in payload["cases"]:
        task = seqio.get_mixture_or_task(case["task"])
        tails[case["task"]] = tail_names(task)
        examples = text_examples(task, case["examples"], case["spec"])
        outputs[case["id"]] = [texts(ex) for ex in examples]
        if case.get("predictions"):
            postprocessed[case["id"]] = [
                postprocess(task, ex, case["predictions"]) for ex in examples
            ]
    return {
        "names": sorted(seqio.TaskRegistry.names()),
        "tails": tails,
        "outputs": outputs,
        "postprocessed": postprocessed,
    }


if __name__ == "__main__":
    from tests.oracle import oracle_main

    oracle_main(compute)
