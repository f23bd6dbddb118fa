"""The settings of a training run, in the groups a researcher thinks in: what data, how long and
how fast (the schedule), which optimizer, when to checkpoint, what to evaluate, how to react to
a bad step. Each group is a gin-configurable dataclass (`Data.batch_size = 32`,
`Schedule.kind = 'linear_decay'`, `Checkpointing.every = 1000`), built by `train.train` and
checked as it is built, before anything is read or written.

The groups hold 29 of the 34 flat `train.*` parameters that `train` once took (it keeps
model_dir, model_class, seed, log_every and profile_steps): a binding of an old name
(`train.batch_size`) is answered with its new one (`moved_binding`), so an older gin file fails
with an error that says what to write instead.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Callable, Mapping, Sequence, TypeVar

import gin

from t5x_like import config, optimizers
from t5x_like.errors import ConfigError
from t5x_like.trainer import NONFINITE_POLICIES

if TYPE_CHECKING:  # (input_pipeline imports TensorFlow: not needed to read settings)
    from t5x_like.input_pipeline import TaskLike

FeatureLengths = Mapping[str, int]
G = TypeVar("G")


def _check(group: object, rules: dict[str, config.Number]) -> None:
    """Check the numeric fields of `group` by `rules`, naming the binding (`Data.batch_size`)."""
    config.check_numbers(type(group).__name__, vars(group), rules)


@gin.configurable
@dataclasses.dataclass(frozen=True)
class Data:
    """What the run reads. `task` is a seqio task or mixture name (or the object itself);
    `task_feature_lengths` the tokens per feature, packed (`pack`) several examples to a row
    or one per row padded; `tfds_data_dir` where TFDS datasets are prepared.

    The batches of every step are fixed by (task, batch_size, the run's seed, `shards`) and the
    step: `shards` is how many equal blocks each global batch is read in, one per host, so a
    resumed run on any number of hosts that divides it reads the same batches (default: the
    process count of the first run).

    `phases` runs the steps in phases of other feature lengths, e.g. BERT's
    ((0.9, {'inputs': 128, 'targets': 20}), (1.0, {'inputs': 512, 'targets': 80})): each pair
    is (the fraction of the train steps where the phase ends, its task_feature_lengths).
    """

    task: TaskLike = "offline_span_corruption"
    task_feature_lengths: FeatureLengths = dataclasses.field(
        default_factory=lambda: {"inputs": 512, "targets": 114}
    )
    batch_size: int = 128
    pack: bool = True
    tfds_data_dir: str | None = None
    shards: int | None = None
    phases: Sequence[tuple[float, FeatureLengths]] | None = None

    def __post_init__(self) -> None:
        _check(
            self,
            {
                "batch_size": config.Number(int, minimum=1),
                "shards": config.Number(int, minimum=1, optional=True),
            },
        )
        object.__setattr__(self, "task_feature_lengths", dict(self.task_feature_lengths))
        self._check_phases()

    def _check_phases(self) -> None:
        previous = 0.0
        for fraction, _ in self.phases or ():
            if not previous < float(fraction) <= 1.0:
                raise ConfigError(
                    f"Data.phases: the end fractions must increase within (0, 1], got "
                    f"{self.phases}."
                )
            previous = float(fraction)
        if self.phases and previous != 1.0:
            raise ConfigError(f"Data.phases: the last phase must end at 1.0, got {previous}.")

    def phase_plan(self, train_steps: int) -> list[tuple[int, dict[str, int]]]:
        """[(the step the phase ends before, its task_feature_lengths)]: one phase of the
        run's feature lengths unless `phases` says otherwise."""
        if not self.phases:
            return [(train_steps, dict(self.task_feature_lengths))]
        return [
            (int(round(float(fraction) * train_steps)), dict(lengths))
            for fraction, lengths in self.phases
        ]


@gin.configurable
@dataclasses.dataclass(frozen=True)
class Schedule:
    """How long the run is and its learning rate at each step.

    `kind` names a schedule of `optimizers.SCHEDULES` or is a callable gin builds that gets the
    total steps (`Schedule.kind = @my_schedule`): 'inverse_sqrt' is T5's pretraining
    1/sqrt(max(step, warmup_steps)) x `learning_rate_scale` (section 3.1.2); 'constant' its
    fine-tuning `constant_learning_rate`; 'linear_decay' BERT's linear warm-up over
    `warmup_steps` to `peak_learning_rate` then linear decay to 0 at `train_steps`; 'cosine'
    GPT-1's warm-up then cosine annealing to 0.

    BERT's fine-tuning recipes count in epochs: `train_epochs` sets the train steps to
    epochs x (the train split's examples) / batch size, and `warmup_proportion` the warm-up
    to that share of them (the reference's 0.1).
    """

    kind: str | optimizers.ScheduleFactory = "inverse_sqrt"
    train_steps: int = 2**19
    warmup_steps: int = 10_000
    learning_rate_scale: float = 1.0
    constant_learning_rate: float = 0.001
    peak_learning_rate: float = 1e-4
    train_epochs: float | None = None
    warmup_proportion: float | None = None

    def __post_init__(self) -> None:
        _check(
            self,
            {
                "train_steps": config.Number(int, minimum=1),
                "warmup_steps": config.Number(int, minimum=0),
                "learning_rate_scale": config.Number(float, above=0),
                "constant_learning_rate": config.Number(float, above=0),
                "peak_learning_rate": config.Number(float, above=0),
                "train_epochs": config.Number(float, above=0, optional=True),
                "warmup_proportion": config.Number(float, minimum=0, maximum=1, optional=True),
            },
        )
        if not callable(self.kind) and self.kind not in optimizers.SCHEDULES:
            raise ConfigError(
                f"Schedule.kind={self.kind!r}; choose one of {optimizers.SCHEDULES}, or bind "
                "a callable that builds an optax schedule from the run's total steps "
                "(--gin.Schedule.kind=@my_schedule)."
            )

    def resolved(self, examples_steps: Callable[[float], int]) -> Schedule:
        """This schedule with `train_epochs` and `warmup_proportion` turned into steps;
        `examples_steps(epochs)` counts the steps of that many passes over the train split."""
        steps = examples_steps(self.train_epochs) if self.train_epochs else self.train_steps
        warmup = (
            int(steps * self.warmup_proportion)
            if self.warmup_proportion is not None
            else self.warmup_steps
        )
        return dataclasses.replace(
            self, train_steps=steps, warmup_steps=warmup, train_epochs=None, warmup_proportion=None
        )

    def learning_rate(self):
        """The optax schedule these settings describe."""
        return optimizers.learning_rate_schedule(
            self.kind,
            self.warmup_steps,
            self.learning_rate_scale,
            self.constant_learning_rate,
            self.peak_learning_rate,
            self.train_steps,
        )


@gin.configurable
@dataclasses.dataclass(frozen=True)
class Optimizer:
    """How the gradients become updates. `kind` is 'adafactor' (T5's) or 'adamw' (BERT's and
    GPT's, its settings on `bert_adamw`), or a callable gin builds that gets the learning-rate
    schedule (`Optimizer.kind = @my_optimizer`). `num_microbatches` splits each batch into that
    many micro-batches whose gradients are summed before the one update (the same step as the
    whole batch, in less memory)."""

    kind: str | optimizers.OptimizerFactory = "adafactor"
    num_microbatches: int = 1

    def __post_init__(self) -> None:
        _check(self, {"num_microbatches": config.Number(int, minimum=1)})
        optimizers.optimizer_factory(self.kind)  # an unknown name fails here, not mid-start-up


@gin.configurable
@dataclasses.dataclass(frozen=True)
class Checkpointing:
    """Save the train state every `every` steps (and at the end, and when preempted), keeping
    the newest `keep` (None: all). `init_checkpoint` starts a fresh run (fine-tuning) from the
    parameters of a checkpoint, with a fresh optimizer; a run with checkpoints of its own
    resumes from them instead."""

    every: int = 1000
    keep: int | None = 5
    init_checkpoint: str | None = None

    def __post_init__(self) -> None:
        _check(
            self,
            {
                "every": config.Number(int, minimum=1),
                "keep": config.Number(int, minimum=1, optional=True),
            },
        )


@gin.configurable
@dataclasses.dataclass(frozen=True)
class Evaluation:
    """What the run measures besides its training loss. Every `loss_every` steps (0: never) the
    loss on the first `loss_batches` validation batches; every `metrics_every` steps (0: never)
    each task's metrics on its decoded validation examples (the first `metrics_examples`, all
    when None, `metrics_batch_size` at a time), keeping the best parameters per task in
    MODEL_DIR/best/<task>; at the end, `num_predictions` validation inputs printed beside the
    model's predictions."""

    loss_every: int = 1000
    loss_batches: int = 10
    metrics_every: int = 0
    metrics_examples: int | None = None
    metrics_batch_size: int = 32
    num_predictions: int = 4

    def __post_init__(self) -> None:
        _check(
            self,
            {
                "loss_every": config.Number(int, minimum=0),
                "loss_batches": config.Number(int, minimum=0),
                "metrics_every": config.Number(int, minimum=0),
                "metrics_examples": config.Number(int, minimum=1, optional=True),
                "metrics_batch_size": config.Number(int, minimum=1),
                "num_predictions": config.Number(int, minimum=0),
            },
        )


@gin.configurable
@dataclasses.dataclass(frozen=True)
class Health:
    """What a bad step does. A step whose loss or gradient norm is NaN/Inf keeps the old
    parameters; `nonfinite_policy` 'stop' then saves the last good state and ends the run
    (exit 3), 'skip' drops the batch and goes on, 'none' applies the update anyway. A loss
    above `loss_spike_ratio` x its recent median is logged as a spike.
    `inject_nonfinite_at_steps` makes those steps' gradients NaN: a fault drill."""

    nonfinite_policy: str = "stop"
    inject_nonfinite_at_steps: Sequence[int] = ()
    loss_spike_ratio: float = 1.5

    def __post_init__(self) -> None:
        _check(self, {"loss_spike_ratio": config.Number(float, above=1)})
        if self.nonfinite_policy not in NONFINITE_POLICIES:
            raise ConfigError(
                f"Health.nonfinite_policy={self.nonfinite_policy!r}: choose one of "
                f"{', '.join(NONFINITE_POLICIES)}."
            )
        steps = self.inject_nonfinite_at_steps
        if not isinstance(steps, (list, tuple)) or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in steps
        ):
            raise ConfigError(
                f"Health.inject_nonfinite_at_steps={steps!r} must be a tuple of step numbers, "
                "e.g. (1000,)."
            )
        object.__setattr__(self, "inject_nonfinite_at_steps", tuple(steps))


# train's former flat parameters and the group setting each became.
MOVED = {
    "task": "Data.task",
    "task_feature_lengths": "Data.task_feature_lengths",
    "batch_size": "Data.batch_size",
    "pack": "Data.pack",
    "tfds_data_dir": "Data.tfds_data_dir",
    "data_shards": "Data.shards",
    "phases": "Data.phases",
    "learning_rate_schedule": "Schedule.kind",
    "train_steps": "Schedule.train_steps",
    "warmup_steps": "Schedule.warmup_steps",
    "learning_rate_scale": "Schedule.learning_rate_scale",
    "constant_learning_rate": "Schedule.constant_learning_rate",
    "peak_learning_rate": "Schedule.peak_learning_rate",
    "train_epochs": "Schedule.train_epochs",
    "warmup_proportion": "Schedule.warmup_proportion",
    "optimizer": "Optimizer.kind",
    "num_microbatches": "Optimizer.num_microbatches",
    "checkpoint_every": "Checkpointing.every",
    "keep_checkpoints": "Checkpointing.keep",
    "init_checkpoint": "Checkpointing.init_checkpoint",
    "eval_every": "Evaluation.loss_every",
    "eval_batches": "Evaluation.loss_batches",
    "metrics_eval_every": "Evaluation.metrics_every",
    "metrics_eval_examples": "Evaluation.metrics_examples",
    "metrics_eval_batch_size": "Evaluation.metrics_batch_size",
    "num_predictions": "Evaluation.num_predictions",
    "nonfinite_policy": "Health.nonfinite_policy",
    "inject_nonfinite_at_steps": "Health.inject_nonfinite_at_steps",
    "loss_spike_ratio": "Health.loss_spike_ratio",
}

_UNKNOWN_TRAIN_PARAMETER = re.compile(
    r"Configurable '(?:[\w.]+\.)?train' doesn't have a parameter named '(\w+)'"
)


def moved_binding(gin_error: str) -> str | None:
    """For gin's error on a binding of a former `train` parameter, the sentence that names the
    setting it became; None for any other error."""
    match = _UNKNOWN_TRAIN_PARAMETER.search(gin_error)
    if not match or match.group(1) not in MOVED:
        return None
    old = match.group(1)
    return (
        f"train.{old} is now {MOVED[old]}: train's settings are grouped (Data, Schedule, "
        f"Optimizer, Checkpointing, Evaluation, Health); bind {MOVED[old]} instead."
    )


def built(group: type[G], value: object, parameter: str) -> G:
    """`value` of `train`'s group parameter `parameter`, or the group built from its gin
    bindings when None. A value of another kind is an old flat binding of the same name
    (`train.optimizer = 'adamw'`, now `Optimizer.kind`): refused, naming what to bind."""
    if value is None:
        return group()
    if isinstance(value, group):
        return value
    hint = (
        f"bind {MOVED[parameter]} instead (--gin.{MOVED[parameter]}={value!r})"
        if parameter in MOVED
        else f"bind the {group.__name__}.* settings instead"
    )
    raise ConfigError(
        f"train.{parameter}={value!r}: train.{parameter} is the {group.__name__} group of "
        f"settings now; {hint}."
    )
