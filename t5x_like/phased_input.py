"""A run's training batches over its length phases (`Data.phases`), and their position beside
each checkpoint.

A run in phases (BERT's 90% of the steps at 128 tokens, then 512) reads one
`train_data.HostBatches` stream per phase, seeded by the run's seed plus the step the phase
starts at, so the batch of a step depends on the run's settings and the step only. A resumed
run opens the stream of the phase its step falls in where the checkpoint of that step saved it
(else by skipping that phase's batches before it): the data continues exactly where it was.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from t5x_like import train_data
from t5x_like.checkpoints import input_state

if TYPE_CHECKING:
    from t5x_like.input_pipeline import TaskLike
    from t5x_like.models.base import Model

# [(the step the phase ends before, its task_feature_lengths)], as `Data.phase_plan` gives.
PhasePlan = Sequence[tuple[int, Mapping[str, int]]]


class PhasedInput:
    """The training stream of each phase, opened at a step, and its saved position.

    `log` prints a line of the run's log (how a resumed stream started, a position that could
    not be saved)."""

    def __init__(
        self,
        order: train_data.DataOrder,
        plan: PhasePlan,
        *,
        pack: bool,
        model: Model,
        model_dir: str,
        task: TaskLike,
        log: Callable[[str], None],
    ) -> None:
        self._order, self._plan = order, list(plan)
        self._pack, self._model, self._model_dir, self._task = pack, model, model_dir, task
        self._log = log
        self._stream: train_data.HostBatches | None = None
        self._first = 0  # the step the open stream's phase starts at
        self._warned = False  # a failed position save is reported once per run

    def phase_at(self, step: int) -> int:
        """The index of the phase `step` falls in (the last phase past the end)."""
        return next((i for i, (end, _) in enumerate(self._plan) if step < end), len(self._plan) - 1)

    def feature_lengths(self, phase: int) -> dict[str, int]:
        return dict(self._plan[phase][1])

    def describe(self, step: int) -> str:
        """The log line's words for the phase of `step`: 'phase 2 of 2: task feature lengths
        {...}'."""
        phase = self.phase_at(step)
        return (
            f"phase {phase + 1} of {len(self._plan)}: task feature lengths "
            f"{self.feature_lengths(phase)}"
        )

    def batches_from(self, step: int) -> train_data.HostBatches:
        """The stream of the phase `step` falls in, from `step` on: where the checkpoint of
        `step` saved it, else by skipping the phase's batches before it."""
        phase = self.phase_at(step)
        first = self._plan[phase - 1][0] if phase else 0
        stream = train_data.HostBatches(
            dataclasses.replace(self._order, seed=self._order.seed + first),
            self._plan[phase][1],
            start_batch=step - first,
            pack=self._pack,
            model=self._model,
            restore_from=(
                input_state.input_state_dir(self._model_dir, step) if step > first else None
            ),
            task=self._task,
        )
        if step > first:
            self._log(
                f"step {step:>7}  input pipeline: {stream.how_started}, so the data continues "
                "exactly where the run left it"
            )
        self._stream, self._first = stream, first
        return stream

    def save_position(self, step: int) -> None:
        """Save the open stream beside the checkpoint of `step`, if it stands at that step
        (after a non-finite stop it has read one batch more: a resume then skips instead)."""
        stream = self._stream
        if stream is None or stream.position != step - self._first:
            return
        why_not = stream.save(input_state.input_state_dir(self._model_dir, step))
        if why_not and not self._warned:
            self._warned = True
            self._log(
                f"step {step:>7}  Note: the input pipeline's position could not be saved "
                f"({why_not}); a resume will re-read the batches before its step instead."
            )
