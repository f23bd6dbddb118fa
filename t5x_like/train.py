"""Train a model (T5, or another family with `train.model_class`) from gin files.

    python -m t5x_like.train --gin_file=gin_configs/models/t5_1_1/small.gin \\
        --gin_file=gin_configs/runs/pretrain.gin --gin.MODEL_DIR=/tmp/run --gin.TRAIN_STEPS=1000

Later files override earlier ones and `--gin.KEY=VALUE` bindings override files; plain strings
need no quotes. The run reads like a recipe, in sections: settings -> task -> model -> mesh ->
optimizer -> checkpoint (where to start) -> data -> state -> loop -> predictions; the loop's
state lives in `_Training`, not in closures. Rerunning the same command resumes from the newest
checkpoint in MODEL_DIR.
"""

from __future__ import annotations

if __name__ == "__main__":  # `python -m t5x_like.train`: run it under that name
    from t5x_like.cli import main_of_module

    main_of_module("t5x_like.train")

import dataclasses
import itertools
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Iterator, Mapping, NoReturn, Sequence, cast

import gin
import jax
import numpy as np
import seqio
from clu import metric_writers

from t5x_like import (
    classifier_eval,
    cli,
    config,
    decoding,
    errors,
    flops,
    hardware,
    input_pipeline,
    logs,
    optimizers,
    partitioning,
    preemption,
    run_health,
    run_lock,
    storage,
    train_data,
    train_settings,
    trainer,
)

# `evaluation` is train's group of evaluation settings; the module is `task_eval` here.
from t5x_like import evaluation as task_eval
from t5x_like.checkpoints import input_state, params_io, tokenizer_files, train_state
from t5x_like.checkpoints.best import BestCheckpoints
from t5x_like.models import base
from t5x_like.models.base import Model
from t5x_like.phased_input import PhasedInput
from t5x_like.train_settings import Checkpointing, Data, Evaluation, Health, Optimizer, Schedule


def _check_model_dir(model_dir: str | None) -> str:
    if not model_dir:
        raise errors.ConfigError("No model directory: pass --gin.MODEL_DIR=/path/for/this/run.")
    model_dir = storage.resolve(model_dir)
    try:
        probe = os.path.join(model_dir, f".write_test-{jax.process_index()}")
        storage.write_text(probe, "ok")
        storage.remove(probe)
    except storage.ERRORS as e:
        raise errors.ConfigError(
            f"MODEL_DIR {model_dir} is not writable ({e}); choose another --gin.MODEL_DIR."
        ) from e
    return model_dir


def _check_resume_config(checkpointer: train_state.Checkpointer, cfg) -> None:
    saved, current = checkpointer.restore_config().to_json(), cfg.to_json()
    diffs = [
        f"{k}: checkpoint {v!r} vs config {current.get(k)!r}"
        for k, v in saved.items()
        if v != current.get(k) and k not in params_io.COMPUTE_ONLY_FIELDS
    ]
    if "scan_layers" in saved and saved["scan_layers"] != current.get("scan_layers"):
        raise errors.ConfigError(
            f"MODEL_DIR {checkpointer.directory} was trained with scan_layers="
            f"{saved['scan_layers']}; resume with --gin.{type(cfg).__name__}.scan_layers="
            f"{saved['scan_layers']} (the optimizer state is in that layout), or start a new "
            "run from it with --gin.Checkpointing.init_checkpoint, which converts the parameters."
        )
    if diffs:
        raise errors.ConfigError(
            f"MODEL_DIR {checkpointer.directory} holds a checkpoint of a different model "
            f"({'; '.join(diffs)}). Use another --gin.MODEL_DIR or the checkpoint's model gin "
            "file."
        )


def _write_text(path: str, text: str) -> None:
    if jax.process_index() == 0:
        storage.write_text(path, text)


# The numeric settings `train` takes itself; the groups check their own (`train_settings`).
SETTINGS = {
    "log_every": config.Number(int, minimum=1),
    "seed": config.Number(int),
}


@gin.configurable
def train(
    model_dir: str | None = None,
    model_class: Callable[[], Model] | None = None,
    data: Data | None = None,
    schedule: Schedule | None = None,
    optimizer: Optimizer | None = None,
    checkpointing: Checkpointing | None = None,
    evaluation: Evaluation | None = None,
    health: Health | None = None,
    seed: int = 0,
    log_every: int = 100,
    profile_steps: str | None = None,
) -> trainer.TrainState:
    """Pretrain or fine-tune, and return the final train state.

    The settings come in groups, each a gin configurable of `t5x_like.train_settings` built
    here from its bindings unless given: `Data` (task, feature lengths, batch size, packing,
    phases), `Schedule` (train steps and the learning rate), `Optimizer`, `Checkpointing`,
    `Evaluation`, `Health` (non-finite steps, loss spikes). Their defaults are the T5 paper's
    baseline (2^19 steps of 128 x 512 packed tokens, AdaFactor, 1/sqrt(max(step, 10^4))).
    Fine-tuning (gin_configs/runs/finetune.gin) starts from `Checkpointing.init_checkpoint`'s
    parameters with a fresh optimizer and a constant 0.001, and every
    `Evaluation.metrics_every` steps decodes each task's validation examples, scores them with
    the task's metrics (TensorBoard `eval/<task>/<metric>`) and keeps the best parameters per
    task in MODEL_DIR/best/<task>.

    Nothing is lost when a run dies: the batch of every step is fixed by (task, batch size,
    `seed`, `Data.shards`) and the step (`t5x_like.train_data`), the dropout rng by the seed
    and the step, so rerunning the command resumes from the newest complete checkpoint and
    reproduces the uninterrupted run bit for bit, on any number of hosts that divides
    `Data.shards`; a run in phases continues in the phase its step falls in.

    `model_class` builds the model: T5's encoder-decoder unless bound
    (`base.DEFAULT_MODEL_CLASS`), or another family's (`@BertPretrainingModel`,
    `@BertClassifierModel`, ...). `profile_steps` ('START:END') writes a profile of those
    steps for TensorBoard.
    """

    # --- settings, checked before anything is touched ------------------------------------
    config.check_numbers("train", locals(), SETTINGS)
    data = train_settings.built(Data, data, "data")
    schedule = train_settings.built(Schedule, schedule, "schedule")
    optimizer = train_settings.built(Optimizer, optimizer, "optimizer")
    checkpointing = train_settings.built(Checkpointing, checkpointing, "checkpointing")
    evaluation = train_settings.built(Evaluation, evaluation, "evaluation")
    health = train_settings.built(Health, health, "health")
    model_dir = _check_model_dir(model_dir)
    # One run per MODEL_DIR (process 0 holds the lock for all), before anything is removed
    # or written there.
    lock = run_lock.acquire(model_dir) if jax.process_index() == 0 else None
    # From here a SIGTERM ends start-up at once (nothing trained, nothing saved: exit 0) and,
    # once training has begun, stops it at the next step with a checkpoint.

    def end_start_up(signal_name: str) -> None:
        _log(
            f"Stopped by {signal_name} during start-up, before the first step: nothing was "
            "trained, so nothing is saved. Rerun the same command to start."
        )
        if lock is not None:
            lock.release()

    watcher = preemption.PreemptionWatcher(end_start_up=end_start_up)
    run: _Training | None = None
    try:
        # --- task: resolved once, then everything that could refuse it, before any state
        if data.tfds_data_dir:
            seqio.set_tfds_data_dir_override(data.tfds_data_dir)
        # A resumed run's own copy (carry_into_run), else the INIT_CHECKPOINT's.
        tokenizer_files.offer_to_tasks(checkpointing.init_checkpoint or model_dir)
        task_obj = input_pipeline.resolve_task(data.task)
        input_pipeline.check_data_available(task_obj, "train")
        schedule = schedule.resolved(
            lambda epochs: input_pipeline.steps_for_epochs(task_obj, epochs, data.batch_size)
        )
        phase_plan = data.phase_plan(schedule.train_steps)
        profile = _profile_window(profile_steps)

        # --- model -----------------------------------------------------------------------
        model = (model_class or base.default_model_class())()
        input_pipeline.check_vocabulary(task_obj, model.config.vocab_size)
        input_pipeline.check_num_labels(task_obj, model)
        for _, lengths in phase_plan:
            input_pipeline.check_sequence_fits(
                model,
                lengths,
                data.pack,
                binding="Data.phases" if data.phases else "Data.task_feature_lengths",
            )

        # --- mesh ------------------------------------------------------------------------
        mesh = partitioning.make_mesh()
        rules = partitioning.logical_axis_rules(num_partitions=partitioning.model_axis_size(mesh))
        partitioning.check_rules_match_mesh(rules, mesh)
        partitioning.check_batch_size(data.batch_size, mesh, optimizer.num_microbatches, rules)

        # --- optimizer -------------------------------------------------------------------
        lr_fn = schedule.learning_rate()
        tx = optimizers.make_optimizer(optimizer.kind, lr_fn, model.frozen_modules)
        layout = trainer.make_layout(model, tx, mesh, rules)  # abstract: cheap
        abstract = trainer.abstract_state(model, tx, layout)

        # --- checkpoint: where the run starts --------------------------------------------
        checkpointer = train_state.Checkpointer(model_dir, checkpointing.keep)
        start_step = checkpointer.latest_step() or 0
        _log_discarded_saves(checkpointer, start_step)
        vocabularies = input_pipeline.task_vocabularies(task_obj)
        record = checkpointer.restore_record(start_step) if start_step else {}
        if start_step:
            _check_resume_config(checkpointer, model.config)
            input_pipeline.check_resumed_vocabulary(
                record.get("vocabularies", {}), vocabularies, model_dir, task_obj.name
            )
        elif checkpointing.init_checkpoint:
            params_io.check_compatible(
                params_io.restore_config(
                    params_io.checkpoint_directory(checkpointing.init_checkpoint)
                ),
                model.config,
                checkpointing.init_checkpoint,
            )
            input_pipeline.check_checkpoint_vocabulary(task_obj, checkpointing.init_checkpoint)
            if jax.process_index() == 0:
                tokenizer_files.carry_into_run(checkpointing.init_checkpoint, model_dir)
        eval_tasks = task_eval.evaluable_tasks(task_obj) if evaluation.metrics_every else []
        _write_start_up_report(
            model_dir, mesh, rules, layout, abstract, model, phase_plan[0][1], data.batch_size
        )

        # --- data ------------------------------------------------------------------------
        order = _data_order(data, seed, record)
        train_input = PhasedInput(
            order,
            phase_plan,
            pack=data.pack,
            model=model,
            model_dir=model_dir,
            task=task_obj,
            log=_log,
        )
        train_iter = train_input.batches_from(start_step)
        # The first batch before the state is built: an empty task fails now.
        first_batch = input_pipeline.check_not_empty(
            next(train_iter, None),
            task_obj.name,
            "train",
            train_input.feature_lengths(train_input.phase_at(start_step)),
        )
        if len(phase_plan) > 1:
            _log(f"step {start_step:>7}  {train_input.describe(start_step)}")

        # --- state -----------------------------------------------------------------------
        rng = jax.random.key(seed)
        if start_step:
            state = checkpointer.restore(abstract, start_step)
            _log(f"Resumed from the checkpoint at step {start_step} in {checkpointer.directory}")
        elif checkpointing.init_checkpoint:
            params = params_io.load_pretrained(
                checkpointing.init_checkpoint,
                model.config,
                abstract.params,
                fresh_params=lambda: trainer.init_state(model, tx, rng, layout).params,
            )
            state = trainer.state_from_params(params, tx, layout)
            _log(f"Fine-tuning from the parameters in {checkpointing.init_checkpoint}")
        else:
            state = trainer.init_state(model, tx, rng, layout)

        # --- loop ------------------------------------------------------------------------
        run = _Training(
            model=model,
            layout=layout,
            train_step=trainer.make_train_step(
                model,
                tx,
                lr_fn,
                layout,
                optimizer.num_microbatches,
                health.nonfinite_policy,
                tuple(health.inject_nonfinite_at_steps),
            ),
            eval_step=trainer.make_eval_step(model, layout),
            rng=rng,
            task=task_obj,
            eval_tasks=eval_tasks,
            train_input=train_input,
            checkpointer=checkpointer,
            data_order=order,
            vocabularies=vocabularies,
            window=_MetricsWindow(int(record.get("nonfinite_steps", 0))),
            spikes=run_health.LossSpikes(health.loss_spike_ratio),
            model_dir=model_dir,
            data=data,
            train_steps=schedule.train_steps,
            checkpointing=checkpointing,
            evaluation=evaluation,
            health=health,
            log_every=log_every,
            profile=profile,
            watcher=watcher,
        )
        state, step, preempted = run.loop(
            state, start_step, itertools.chain([first_batch], train_iter)
        )
        _log_saved(checkpointer.close())  # the watcher still guards this last save
        watcher.close()
        if preempted:
            _log(
                f"step {step:>7}  stopped by {watcher.signal_name}: rerun the same "
                "command to resume from this step"
            )
        run.writer.flush()

        # --- predictions -----------------------------------------------------------------
        if (
            evaluation.num_predictions
            and not preempted
            and jax.process_index() == 0
            and model.PROMPT_FEATURE is not None
        ):
            show_predictions(
                model,
                jax.device_get(state.params),
                task_obj,
                run.feature_lengths,
                evaluation.num_predictions,
            )
        return state
    finally:
        if run is not None and run.bar is not None:
            run.bar.close()  # before the error a failure prints, so that is the log's last line
        watcher.close()
        if lock is not None:
            lock.release()


def _log_discarded_saves(checkpointer: train_state.Checkpointer, start_step: int) -> None:
    """Say which unfinished or unverifiable saves the checkpointer removed, and what the run
    starts from instead."""
    resuming = (
        f"Resuming from step {start_step}, the newest complete checkpoint."
        if start_step
        else "There is no complete checkpoint: starting afresh."
    )
    for leftover in checkpointer.interrupted_saves:
        _log(
            f"Ignoring {leftover} in {checkpointer.directory}: a save that was interrupted "
            f"before it completed (removed now). {resuming}"
        )
    for step in checkpointer.unverified_saves:
        _log(
            f"Ignoring step {step} in {checkpointer.directory}: it has no manifest (the "
            "run stopped before it was written), so it cannot be checked (removed now). "
            f"{resuming}"
        )


def _write_start_up_report(
    model_dir: str,
    mesh: jax.sharding.Mesh,
    rules,
    layout: trainer.Layout,
    abstract: trainer.TrainState,
    model: Model,
    feature_lengths: Mapping[str, int],
    batch_size: int,
) -> None:
    """Print and save the operative gin config (MODEL_DIR/config.gin) and the partitioning:
    mesh, rules, each parameter's sharding, bytes per device, size and FLOPs
    (MODEL_DIR/partitioning.txt)."""
    print(
        f"Operative config (saved to {model_dir}/config.gin):\n{gin.operative_config_str()}",
        flush=True,
    )
    _write_text(os.path.join(model_dir, "config.gin"), gin.operative_config_str())
    table, _ = partitioning.parameter_table(layout.boxed_params, layout.state_shardings.params)
    state_bytes = partitioning.state_bytes_per_device(abstract, layout.state_shardings)
    report = (
        f"{partitioning.describe_mesh(mesh)}; rules {list(rules)}\n{table}\n"
        f"parameters + optimizer state per device: {state_bytes:,} bytes\n"
        f"{model_size_line(model, feature_lengths, batch_size)}"
    )
    _log(report)
    _write_text(os.path.join(model_dir, "partitioning.txt"), report + "\n")


def _data_order(data: Data, seed: int, record: Mapping) -> train_data.DataOrder:
    """What fixes the run's batches; a resumed run keeps its shard count (and is told when
    its order differs from the interrupted run's)."""
    saved = train_data.DataOrder(**record["data_order"]) if "data_order" in record else None
    order = train_data.DataOrder(
        data.task,
        data.batch_size,
        seed,
        train_data.resolve_data_shards(data.shards, data.batch_size, jax.process_count(), saved),
    )
    if saved is not None and saved != order:
        _log(
            f"Note: the interrupted run read {saved}; this one reads {order}, so the "
            "batches from here on differ from the ones it would have seen."
        )
    return order


class _MetricsWindow:
    """The train metrics of the steps since the last log line (still on the devices), and the
    count of non-finite steps skipped before them (already logged)."""

    def __init__(self, nonfinite_logged: int) -> None:
        self.metrics: list[dict[str, jax.Array]] = []
        self.nonfinite_logged = nonfinite_logged
        self.start_time = time.perf_counter()

    def restart(self) -> None:
        """Start the next window: no metrics, its time from now."""
        self.metrics, self.start_time = [], time.perf_counter()

    def nonfinite_steps(self) -> int:
        """Skipped steps so far, this window's included."""
        pending = sum(int(m["nonfinite"]) for m in jax.device_get(self.metrics))
        return self.nonfinite_logged + pending

    def summarise(self, step: int, spikes: run_health.LossSpikes, writer) -> dict[str, float]:
        """Report each of the window's steps that was skipped or spiked, and return the
        window's means with the skipped steps so far (read from the devices: the window's
        steps have all run when this returns)."""
        per_step = jax.device_get(self.metrics)
        for offset, values in enumerate(per_step):
            _report_health(step - len(per_step) + 1 + offset, values, spikes, writer)
        summary = _mean_metrics(per_step)
        self.nonfinite_logged += int(summary.pop("nonfinite", 0))
        summary["nonfinite_steps"] = self.nonfinite_logged
        return summary


@dataclasses.dataclass
class _Training:
    """The training loop and what it needs, built by `train`: step, log, evaluate, save."""

    model: Model
    layout: trainer.Layout
    train_step: Callable
    eval_step: Callable
    rng: jax.Array
    task: input_pipeline.TaskLike
    eval_tasks: Sequence[str]
    train_input: PhasedInput
    checkpointer: train_state.Checkpointer
    data_order: train_data.DataOrder
    vocabularies: dict  # the task's, recorded so that a resume with other ones is refused
    window: _MetricsWindow
    spikes: run_health.LossSpikes
    model_dir: str
    data: Data
    train_steps: int
    checkpointing: Checkpointing
    evaluation: Evaluation
    health: Health
    log_every: int
    profile: tuple[int, int] | None
    watcher: preemption.PreemptionWatcher
    # Set as the loop starts.
    feature_lengths: dict[str, int] = dataclasses.field(init=False)
    writer: metric_writers.MetricWriter = dataclasses.field(init=False)
    peak_flops: float = dataclasses.field(init=False)
    best: BestCheckpoints = dataclasses.field(init=False)
    bar: Any = None  # the progress bar
    eval_data: list | None = None  # the validation batches of the current phase

    def loop(
        self, state: trainer.TrainState, step: int, batches: Iterator[dict[str, np.ndarray]]
    ) -> tuple[trainer.TrainState, int, bool]:
        """Train from `step` to the last step, or until preempted: (the state, its step,
        whether it was preempted)."""
        phase = self.train_input.phase_at(step)
        self.feature_lengths = self.train_input.feature_lengths(phase)
        self.writer = metric_writers.create_default_writer(
            os.path.join(self.model_dir, "tensorboard"), just_logging=jax.process_index() > 0
        )
        self.peak_flops, peak_source = hardware.peak_flops()
        _log(f"MFU is model FLOPs per second over {self.peak_flops:.4g} FLOP/s ({peak_source})")
        self.best = BestCheckpoints(os.path.join(self.model_dir, "best"))
        self.bar = logs.progress(total=self.train_steps, initial=step, desc="train")
        profile_start, profile_end = self.profile or (-1, -1)
        trace_dir, preempted = None, False
        self.window.restart()
        self.watcher.started()
        while step < self.train_steps:
            if self.train_input.phase_at(step) != phase:
                phase = self.train_input.phase_at(step)
                self.feature_lengths = self.train_input.feature_lengths(phase)
                batches, self.eval_data = self.train_input.batches_from(step), None
                _log(f"step {step:>7}  {self.train_input.describe(step)}")
            batch = self.layout.global_batch(next(batches))
            if step == profile_start:
                trace_dir = _start_trace(self.model_dir)
            with self.layout.context():
                state, metrics = self.train_step(state, batch, self.rng)
            step += 1
            # One scalar read per step.
            if self.health.nonfinite_policy == "stop" and int(metrics["nonfinite"]):
                self.bar.close()
                _stop_on_nonfinite(
                    step, jax.device_get(metrics), state, self.save, self.checkpointer
                )
            if trace_dir is not None and step == profile_end:
                jax.block_until_ready(state)
                _stop_trace(trace_dir, self.model_dir)
                trace_dir = None
                _log(
                    f"step {step:>7}  profile of steps {profile_start}-{profile_end} "
                    f"written to {self.model_dir}/tensorboard/plugins/profile (TensorBoard's "
                    "Profile tab)"
                )
            self.window.metrics.append(metrics)
            self.bar.update(1)
            last = step == self.train_steps
            if step % self.log_every == 0 or last:
                self.log_window(step)
            if self.evaluation.loss_every and (step % self.evaluation.loss_every == 0 or last):
                self.evaluate_loss(step, state)
            if self.eval_tasks and (step % self.evaluation.metrics_every == 0 or last):
                self.evaluate_tasks(step, state)
            preempted = self.watcher.should_stop(step)
            if preempted or step % self.checkpointing.every == 0 or last:
                self.save(state)
            if preempted:
                break
        self.bar.close()
        return state, step, preempted

    def log_window(self, step: int) -> None:
        """The window's means, speed and MFU: to TensorBoard, the progress bar and the log;
        then the next window starts."""
        summary = self.window.summarise(step, self.spikes, self.writer)
        elapsed, steps = time.perf_counter() - self.window.start_time, len(self.window.metrics)
        tokens_per_batch = self.data.batch_size * sum(self.feature_lengths.values())
        summary["tokens_per_s"] = tokens_per_batch * steps / elapsed
        summary["step_time_s"] = elapsed / steps
        step_flops = flops.train_step_flops(
            self.model.config, self.feature_lengths, self.data.batch_size
        )
        if step_flops:
            summary["mfu"] = hardware.mfu(step_flops, summary["step_time_s"], self.peak_flops)
        self.writer.write_scalars(step, {f"train/{k}": v for k, v in summary.items()})
        self.bar.set_postfix(loss=f"{summary['loss']:.3f}", refresh=False)
        _log(f"step {step:>7}  " + _format_metrics(summary))
        self.window.restart()

    def evaluate_loss(self, step: int, state: trainer.TrainState) -> None:
        """Loss and accuracy on the run's fixed validation batches (read at the first call of
        a phase)."""
        if self.eval_data is None:
            self.eval_data = load_eval_batches(
                self.task,
                self.feature_lengths,
                self.data.batch_size,
                self.evaluation.loss_batches,
                self.data.pack,
                self.model,
            )
        with self.layout.context():
            eval_metrics = evaluate(
                self.eval_step, state.params, self.eval_data, self.layout, self.model
            )
        if eval_metrics:
            self.writer.write_scalars(step, {f"eval/{k}": v for k, v in eval_metrics.items()})
            _log(f"step {step:>7}  eval " + _format_metrics(eval_metrics))

    def evaluate_tasks(self, step: int, state: trainer.TrainState) -> None:
        """Each task's metrics on its decoded validation examples; keep the best parameters."""
        task_metrics = _evaluate_tasks(
            self.model,
            state.params,
            self.eval_tasks,
            self.feature_lengths,
            self.evaluation.metrics_batch_size,
            self.evaluation.metrics_examples,
        )
        for name, values in task_metrics.items():
            self.writer.write_scalars(step, {f"eval/{name}/{k}": v for k, v in values.items()})
            _log(f"step {step:>7}  {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in values.items()))
        self.best.update(step, state.params, self.model.config, task_metrics)

    def save(self, state: trainer.TrainState) -> None:
        """Start saving `state` (in the background) with the input position beside it; say
        "saved" of the previous save, now that it is."""
        step = int(state.step)
        record = {
            "data_order": self.data_order.to_json(),
            "nonfinite_steps": self.window.nonfinite_steps(),
            "vocabularies": self.vocabularies,
        }
        self.train_input.save_position(step)
        _log_saved(self.checkpointer.save(state, self.model.config, record))
        kept = self.checkpointer.steps()
        if kept and jax.process_index() == 0:
            input_state.remove_input_states_before(self.model_dir, min(kept))


def _log_saved(step: int | None) -> None:
    if step is not None:
        _log(f"step {step:>7}  checkpoint saved")


def model_size_line(model: Model, feature_lengths: Mapping[str, int], batch_size: int) -> str:
    """Parameter count and hand-counted model FLOPs (`flops.forward_flops`), so runs of
    different architectures (the T5 paper's Table 2) can be compared at start-up."""
    params = base.count_params(model.abstract_params())
    step = flops.train_step_flops(model.config, feature_lengths, batch_size)
    line = f"model: {type(model).__name__}, {params:,} parameters"
    if step is not None:
        forward = step / (flops.TRAINING_MULTIPLIER * batch_size)
        line += (
            f"; forward FLOPs per example at {dict(feature_lengths)}: {forward:.4g}; "
            f"per train step (x{flops.TRAINING_MULTIPLIER}, batch {batch_size}): "
            f"{step:.4g}"
        )
    return line


def _evaluate_tasks(
    model: Model,
    params,
    task_names: Sequence[str],
    feature_lengths: Mapping[str, int],
    batch_size: int,
    max_examples: int | None,
) -> dict[str, dict[str, float]]:
    """Score each task's validation set with its metrics: decoded text (DecodeConfig from gin;
    greedy by default) for text-to-text models, the head's predictions for BERT's."""
    if model.PROMPT_FEATURE is None:
        return {
            name: classifier_eval.evaluate_task(
                model, params, name, "validation", feature_lengths, batch_size, max_examples
            )
            for name in task_names
        }
    predict_fn = task_eval.make_predict_fn(
        model, feature_lengths["targets"], decoding.DecodeConfig()
    )
    return {
        name: task_eval.evaluate_task(
            predict_fn,
            params,
            name,
            "validation",
            feature_lengths,
            batch_size,
            max_examples,
            eos_id=model.eos_id,
        )[0]
        for name in task_names
    }


def _log(message: str) -> None:
    """A line above the progress bar, flushed at once (stdout may be a file or a pipe); in a
    multi-process run each line says which process wrote it."""
    if jax.process_count() > 1:
        message = f"[process {jax.process_index()}/{jax.process_count()}] {message}"
    logs.log(message)


def _start_trace(model_dir: str) -> str:
    """Start a jax.profiler trace; where it is written (the profiler writes local files only, so
    a remote MODEL_DIR gets it copied in by `_stop_trace`)."""
    trace_dir = (
        tempfile.mkdtemp(prefix="t5x_like_trace-")
        if storage.is_remote(model_dir)
        else os.path.join(model_dir, "tensorboard")
    )
    jax.profiler.start_trace(trace_dir)
    return trace_dir


def _stop_trace(trace_dir: str, model_dir: str) -> None:
    jax.profiler.stop_trace()
    if storage.is_remote(model_dir):
        storage.copy_tree(trace_dir, os.path.join(model_dir, "tensorboard"))
        shutil.rmtree(trace_dir, ignore_errors=True)


def _profile_window(profile_steps: str | None) -> tuple[int, int] | None:
    """`train.profile_steps` / --profile_steps='START:END': trace from step START (completed
    steps) until step END."""
    if not profile_steps:
        return None
    try:
        start, end = (int(x) for x in str(profile_steps).split(":"))
    except ValueError:
        start, end = -1, -1
    if not 0 <= start < end:
        raise errors.ConfigError(
            f"--profile_steps={profile_steps!r}: give START:END with "
            "0 <= START < END, e.g. --profile_steps=10:15."
        )
    return start, end


def _mean_metrics(per_step: Sequence[dict[str, np.ndarray]]) -> dict[str, float]:
    """Means over the window's steps; a skipped (non-finite) step counts only in `nonfinite`."""
    good = [m for m in per_step if not m.get("nonfinite", 0)] or list(per_step)
    means = {k: float(np.mean([m[k] for m in good])) for k in per_step[0]}
    if "nonfinite" in means:
        means["nonfinite"] = float(np.sum([m["nonfinite"] for m in per_step]))
    return means


def _report_health(
    step: int, values: Mapping[str, Any], spikes: run_health.LossSpikes, writer
) -> None:
    """Log a skipped non-finite step or a loss spike (TensorBoard train/loss_spike too)."""
    if values.get("nonfinite", 0):
        _log(
            f"step {step:>7}  non-finite {run_health.nonfinite_description(values)}: update "
            "skipped (Health.nonfinite_policy='skip')"
        )
        return
    spike = spikes.check(step, float(values["loss"]))
    if spike:
        _log(spike)
        writer.write_scalars(step, {"train/loss_spike": float(values["loss"])})


def _stop_on_nonfinite(
    step: int,
    values: Mapping[str, Any],
    state: trainer.TrainState,
    save: Callable[[trainer.TrainState], None],
    checkpointer: train_state.Checkpointer,
) -> NoReturn:
    """Policy 'stop': `state` is the last good one (the step kept it); save it unless that
    step is already saved (or is step 0), then stop with the reason."""
    good_step = int(state.step)
    if good_step and good_step not in checkpointer.steps():
        save(state)
    _log_saved(checkpointer.close())
    raise errors.NonFiniteLoss(
        run_health.stop_message(step, values, good_step or None, checkpointer.directory)
    )


def _format_metrics(summary: Mapping[str, float]) -> str:
    """loss and accuracy first, then the family's own (nsp_loss, ...), rate and speed last."""
    speed = ("learning_rate", "tokens_per_s", "step_time_s", "mfu")
    shown = (
        "loss",
        "accuracy",
        *sorted(
            k
            for k in summary
            if k
            not in (
                "loss",
                "accuracy",
                "grad_norm",
                "param_norm",
                "nonpadding_tokens",
                "masked_tokens",
                "examples",
                "nonfinite_steps",
                *speed,
            )
        ),
        *speed,
    )
    formats = {
        "learning_rate": "{:.2e}",
        "tokens_per_s": "{:,.0f}",
        "step_time_s": "{:.3f}",
        "mfu": "{:.1%}",
    }
    labels = {"tokens_per_s": "tokens/s", "step_time_s": "step_s"}
    return "  ".join(
        f"{labels.get(key, key)} {formats.get(key, '{:.4f}').format(summary[key])}"
        for key in shown
        if key in summary
    )


def load_eval_batches(
    task: input_pipeline.TaskLike,
    feature_lengths: Mapping[str, int],
    batch_size: int,
    num_batches: int,
    pack: bool,
    model: Model,
) -> list[dict[str, np.ndarray]]:
    """The first `num_batches` validation batches, read once and reused at every evaluation
    (a fixed set, so evaluations are comparable); empty if the task has no validation split."""
    provider = input_pipeline.resolve_task(task)
    if "validation" not in provider.splits:
        return []
    ds = input_pipeline.get_dataset(
        provider,
        feature_lengths,
        batch_size,
        "validation",
        shuffle=False,
        seed=0,
        num_epochs=1,
        pack=pack,
        model=model,
    )
    return list(ds.take(num_batches).as_numpy_iterator())


def evaluate(
    eval_step,
    params,
    batches: Sequence[dict[str, np.ndarray]],
    layout: trainer.Layout,
    model: Model,
) -> dict[str, float]:
    """The model's metrics (loss, accuracy, ...) over all of `batches` together."""
    totals: dict[str, float] = {}
    for batch in batches:
        sums = jax.device_get(eval_step(params, layout.global_batch(batch)))
        for k, v in sums.items():
            totals[k] = totals.get(k, 0.0) + float(v)
    if not totals:
        return {}
    # Host floats for the device sums: every family's `metrics` is jnp arithmetic on them,
    # which takes either (and keeps the float64 totals exact until it divides).
    return {k: float(v) for k, v in model.metrics(cast(Mapping[str, jax.Array], totals)).items()}


def show_predictions(
    model: Model,
    params,
    task: input_pipeline.TaskLike,
    feature_lengths: Mapping[str, int],
    count: int,
) -> None:
    """Print validation inputs with the model's greedy output beside the true targets (tasks
    with inputs only: a plain language-modelling task has nothing to continue from)."""
    task_obj = input_pipeline.resolve_task(task)
    if "inputs" not in task_obj.output_features or "inputs" not in feature_lengths:
        return
    split = "validation" if "validation" in task_obj.splits else "train"
    examples = list(task_eval.task_examples(task_obj, split, feature_lengths, count))
    if not examples:
        return
    vocab = task_obj.output_features["targets"].vocabulary
    predict_fn = task_eval.make_predict_fn(model, feature_lengths["targets"])
    predictions = task_eval.predict(
        predict_fn,
        params,
        examples,
        vocab,
        len(examples),
        feature_lengths["inputs"],
        eos_id=model.eos_id,
    )
    print("\nPredictions on validation examples (greedy decoding):")
    for i, (example, prediction) in enumerate(zip(examples, predictions)):
        print(f"\n[{i}] input:     {_shorten(prediction.inputs)}")
        print(f"    predicted: {_shorten(prediction.prediction)}")
        true = vocab.decode(task_eval.until_eos(example["targets"], model.eos_id, vocab))
        print(f"    true:      {_shorten(true)}")


def _shorten(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + " ..."


def main(argv: Sequence[str] | None = None) -> int:
    """`--profile_steps=START:END` is short for `--gin.train.profile_steps='START:END'`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    argv = [
        f"--gin.train.profile_steps='{a.split('=', 1)[1]}'"
        if a.startswith("--profile_steps=")
        else a
        for a in argv
    ]
    return cli.run(train, argv, __doc__.split("\n\n")[0])
