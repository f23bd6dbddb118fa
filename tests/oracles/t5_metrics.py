"""Oracle: the T5 library's (t5 0.9.4) postprocessors and metrics on given decoded text.

Payload: {"task_cases": [...], "metric_cases": [...]}.
- A task case {"id", "task", "targets", "predictions", "examples", "bytes_keys", "seed"} runs
  the T5 library's own registration of `task` (`t5.data.tasks`): its `postprocess_fn` on each
  target (is_target=True) and prediction with the example, then every one of its
  `metric_fns`, merged as seqio merges them. `bytes_keys` name the example fields that are
  bytes in a real (numpy) example.
- A metric case {"id", "metric", "kwargs", "targets", "predictions", "seed"} calls
  `t5.evaluation.metrics.<metric>(targets, predictions, **kwargs)`.
NumPy's global random state is seeded with `seed` right before the metrics (t5's ROUGE
bootstraps from it). Result per case: {"metrics": {...}, "targets": [...], "predictions":
[...]} or {"error": exception type name}.
"""

from __future__ import annotations

import os

from tests.oracle import jsonable, oracle_main


def _example(raw, bytes_keys):
    def encode(v):
        return [x.encode("utf-8") for x in v] if isinstance(v, list) else v.encode("utf-8")

    return {k: encode(v) if k in bytes_keys else v for k, v in raw.items()}


def _task_case(case):
    import numpy as np
    import seqio

    task = seqio.get_mixture_or_task(case["task"])
    examples = [_example(ex, case["bytes_keys"]) for ex in case["examples"]]
    targets = [
        task.postprocess_fn(t, example=ex, is_target=True)
        for t, ex in zip(case["targets"], examples)
    ]
    predictions = [
        task.postprocess_fn(p, example=ex, is_target=False)
        for p, ex in zip(case["predictions"], examples)
    ]
    np.random.seed(case["seed"])
    scores = {}
    for metric_fn in task.metric_fns:
        scores.update(metric_fn(targets, predictions))
    return {
        "metrics": {k: float(v) for k, v in scores.items()},
        "targets": jsonable(targets),
        "predictions": jsonable(predictions),
    }


def _metric_case(case):
    import numpy as np
    from t5.evaluation import metrics

    np.random.seed(case["seed"])
    scores = getattr(metrics, case["metric"])(
        case["targets"], case["predictions"], **case["kwargs"]
    )
    return {"metrics": {k: float(v) for k, v in scores.items()}}


def _guarded(fn, case):
    try:
        return fn(case)
    except Exception as error:  # noqa: BLE001 - the reference's failure is part of its behaviour
        return {"error": type(error).__name__}


def compute(payload):
    import warnings

    import t5.data.utils

    # Never read: no task here tokenizes (the default path is a remote bucket).
    t5.data.utils.DEFAULT_SPM_PATH = os.devnull
    import t5.data.tasks  # noqa: F401  (registers the reference tasks)

    warnings.simplefilter("ignore")  # constant inputs, ill-defined F1: values still returned
    return {
        "task_cases": {c["id"]: _guarded(_task_case, c) for c in payload["task_cases"]},
        "metric_cases": {c["id"]: _guarded(_metric_case, c) for c in payload["metric_cases"]},
    }


if __name__ == "__main__":
    oracle_main(compute)
