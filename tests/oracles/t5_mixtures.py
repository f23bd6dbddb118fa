"""Oracle: the members, mixing rates and evaluated tasks of the T5 library's mixtures
(t5.data.mixtures, t5 0.9.4).

Payload: {"spm_path": a local file name for t5's default vocabulary (never read),
          "data_dir": TFDS data the tasks read (their splits decide what is evaluated),
          "mixtures": [names], "splits": [split names]}.
Result: {mixture: {"rates": {task: rate},
                   "trained": tasks that feed training (a `train` split, rate > 0),
                   "evaluated": {split: tasks t5x's seqio.Evaluator scores on it}}}.
The evaluated tasks are the Evaluator's own choice: `seqio.get_subtasks`, then
`seqio.evaluation.get_valid_eval_tasks` (a metric and the split).
"""

from __future__ import annotations

import sys


def compute(payload: dict) -> dict:
    import t5.data  # noqa: F401  (t5.data.utils is importable only after it)

    sys.modules["t5.data.utils"].DEFAULT_SPM_PATH = payload["spm_path"]
    import seqio
    import t5.data.mixtures  # noqa: F401  (registers every task and mixture)

    seqio.set_tfds_data_dir_override(payload["data_dir"])
    out = {}
    for name in payload["mixtures"]:
        mixture = seqio.get_mixture_or_task(name)
        rates = {t.name: float(mixture.get_rate(t)) for t in mixture.tasks}
        out[name] = {
            "rates": rates,
            "trained": sorted(
                t.name for t in mixture.tasks if "train" in t.splits and rates[t.name] > 0
            ),
            "evaluated": {
                split: sorted(
                    t.name
                    for t in seqio.evaluation.get_valid_eval_tasks(
                        seqio.get_subtasks(mixture), split
                    )
                )
                for split in payload["splits"]
            },
        }
    # Members only (their rates need every dataset prepared).
    out["members"] = {
        name: sorted(t.name for t in seqio.get_mixture_or_task(name).tasks)
        for name in payload.get("member_names", [])
    }
    return out


if __name__ == "__main__":
    from tests.oracle import oracle_main

    oracle_main(compute)
