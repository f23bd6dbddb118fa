"""The best parameters per task during fine-tuning, kept as the T5 paper reports results: the
best validation checkpoint of each task (section 3.1.3), in `MODEL_DIR/best/<task>` with
`best.json` recording each task's step and metrics.
"""

from __future__ import annotations

import json
import os
from typing import Mapping

import jax

from t5x_like import storage
from t5x_like.checkpoints import params_io


class BestCheckpoints:
    """The best parameters per task (by the first metric the task reports, higher is better),
    as the paper reports the best validation checkpoint of each task."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.best: dict[str, dict] = {}
        record = os.path.join(directory, "best.json")
        if storage.exists(record):
            self.best = json.loads(storage.read_text(record))

    def update(
        self, step: int, params, cfg, task_metrics: Mapping[str, Mapping[str, float]]
    ) -> None:
        changed = False
        for name, values in task_metrics.items():
            if not values:
                continue
            key, value = next(iter(values.items()))
            if name in self.best and self.best[name]["value"] >= value:
                continue
            # One step kept per task: orbax drops the previous best once the new one is written.
            params_io.save_params(os.path.join(self.directory, name), params, cfg, step, keep=1)
            self.best[name] = {"step": step, "metric": key, "value": value, "metrics": dict(values)}
            changed = True
        if changed and jax.process_index() == 0:
            storage.write_text(
                os.path.join(self.directory, "best.json"), json.dumps(self.best, indent=2)
            )
