"""A run's health on the host: non-finite steps (the train step itself keeps the old state,
`trainer.make_train_step`) and loss spikes, each turned into a log line a researcher can act on.
"""

from __future__ import annotations

import collections
import math
from typing import Mapping

from t5x_like.errors import ConfigError

GUARDED_METRICS = ("loss", "grad_norm")


def nonfinite_description(metrics: Mapping[str, float]) -> str:
    """Which guarded metric was not finite, with its value: "loss nan, grad_norm inf"."""
    bad = [
        f"{k} {metrics[k]}"
        for k in GUARDED_METRICS
        if k in metrics and not math.isfinite(float(metrics[k]))
    ]
    return ", ".join(bad) or "a non-finite value"


def stop_message(
    step: int, metrics: Mapping[str, float], saved_step: int | None, directory: str
) -> str:
    saved = (
        f"the last good state (step {saved_step}) is in {directory}"
        if saved_step
        else "no update had succeeded, so nothing was saved"
    )
    return (
        f"step {step}: non-finite {nonfinite_description(metrics)}; training stopped "
        f"(Health.nonfinite_policy='stop') and {saved}. Lower the learning rate or check "
        "the data near this step, or bind --gin.Health.nonfinite_policy=skip to drop such "
        "steps, then rerun the command to resume."
    )


class LossSpikes:
    """Flags a step whose loss exceeds `ratio` x the median of the previous `history` finite
    losses (after `min_history` of them), the usual early sign of divergence."""

    def __init__(self, ratio: float = 1.5, history: int = 100, min_history: int = 10) -> None:
        if ratio <= 1.0:
            raise ConfigError(f"Health.loss_spike_ratio={ratio} must be > 1 (e.g. 1.5).")
        self.ratio, self.min_history = ratio, min_history
        self.recent: collections.deque[float] = collections.deque(maxlen=history)

    def check(self, step: int, loss: float) -> str | None:
        """A log line if `loss` at `step` is a spike (non-finite losses are not recorded)."""
        if not math.isfinite(loss):
            return None
        message = None
        if len(self.recent) >= self.min_history:
            median = sorted(self.recent)[len(self.recent) // 2]
            if loss > self.ratio * median:
                message = (
                    f"step {step:>7}  loss spike: {loss:.4f} is {loss / median:.2f}x the "
                    f"median {median:.4f} of the previous {len(self.recent)} steps"
                )
        self.recent.append(loss)
        return message
