"""Train a model (T5, or another family with `train.model_class`) from gin files.

    python -m t5x_like.train --gin_file=gin_configs/models/t5_1_1/small.gin \\
        --gin_file=gin_configs/runs/pretrain.gin --gin.MODEL_DIR=/tmp/run --gin.TRAIN_STEPS=1000

Later files override earlier ones and `--gin.KEY=VALUE` bindings override files; plain strings
need no quotes. The run reads like a recipe, in sections: checks -> mesh -> data -> model ->
optimizer -> checkpoint (resume) -> loop -> predictions. Rerunning the same command resumes
from the newest checkpoint in MODEL_DIR.
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
from typing import Callable, Mapping, Sequence

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
    evaluation,
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
from t5x_like.checkpoints import input_state, params_io, train_state
from t5x_like.checkpoints.best import BestCheckpoints
from t5x_like.models import base
from t5x_like.models.base import Model
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
    `@BertClassifierModel`, ...). `profile_steps` ('START-END') writes a profile of those
    steps for TensorBoard.
    """

    # --- checks, before anything expensive -----------------------------------------------
    config.check_numbers("train", locals(), SETTINGS)  # before MODEL_DIR is touched
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
    bar = None
    try:
        if data.tfds_data_dir:
            seqio.set_tfds_data_dir_override(data.tfds_data_dir)
        task_obj = input_pipeline.resolve_task(data.task)
        input_pipeline.check_data_available(task_obj, "train")
        schedule = schedule.resolved(
            lambda epochs: input_pipeline.steps_for_epochs(task_obj, epochs, data.batch_size)
        )
        train_steps = schedule.train_steps
        phase_plan = data.phase_plan(train_steps)
        profile = _profile_window(profile_steps)
        model = (model_class or base.default_model_class())()
        cfg = model.config
        input_pipeline.check_vocabulary(task_obj, cfg.vocab_size)
        input_pipeline.check_num_labels(task_obj, model)
        for _, lengths in phase_plan:
            input_pipeline.check_sequence_fits(model, lengths, data.pack)
        mesh = partitioning.make_mesh()
        rules = partitioning.logical_axis_rules(num_partitions=partitioning.model_axis_size(mesh))
        partitioning.check_rules_match_mesh(rules, mesh)
        partitioning.check_batch_size(data.batch_size, mesh, optimizer.num_microbatches, rules)
        lr_fn = schedule.learning_rate()
        tx = optimizers.make_optimizer(optimizer.kind, lr_fn, model.frozen_modules)
        layout = trainer.make_layout(model, tx, mesh, rules)  # abstract: cheap
        abstract = trainer.abstract_state(model, tx, layout)
        checkpointer = train_state.Checkpointer(model_dir, checkpointing.keep)
        start_step = checkpointer.latest_step() or 0
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
        vocabularies = input_pipeline.task_vocabularies(task_obj)
        record = checkpointer.restore_record(start_step) if start_step else {}
        if start_step:
            _check_resume_config(checkpointer, cfg)
            input_pipeline.check_resumed_vocabulary(
                record.get("vocabularies", {}), vocabularies, model_dir, task_obj.name
            )
        elif checkpointing.init_checkpoint:
            params_io.check_compatible(
                params_io.restore_config(
                    params_io.checkpoint_directory(checkpointing.init_checkpoint)
                ),
                cfg,
                checkpointing.init_checkpoint,
            )
        eval_tasks = evaluation.evaluable_tasks(task_obj) if evaluation.metrics_every else []

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
            f"{model_size_line(model, phase_plan[0][1], data.batch_size)}"
        )
        _log(report)
        _write_text(os.path.join(model_dir, "partitioning.txt"), report + "\n")

        # --- data --------------------------------------------------------------------------
        saved_order = (
            train_data.DataOrder(**record["data_order"]) if "data_order" in record else None
        )
        order = train_data.DataOrder(
            data.task,
            data.batch_size,
            seed,
            train_data.resolve_data_shards(
                data.shards, data.batch_size, jax.process_count(), saved_order
            ),
        )
        if saved_order is not None and saved_order != order:
            _log(
                f"Note: the interrupted run read {saved_order}; this one reads {order}, so the "
                "batches from here on differ from the ones it would have seen."
            )

        def train_batches(phase_index: int, step: int) -> train_data.HostBatches:
            """The phase's stream (seeded by the step the phase starts at), from `step` on: where
            the checkpoint of `step` saved it, else by skipping the phase's batches before it."""
            first = _phase_start(phase_plan, phase_index)
            stream = train_data.HostBatches(
                dataclasses.replace(order, seed=seed + first),
                phase_plan[phase_index][1],
                start_batch=step - first,
                pack=data.pack,
                model=model,
                restore_from=input_state.input_state_dir(model_dir, step) if step > first else None,
                task=task_obj,
            )
            if step > first:
                _log(
                    f"step {step:>7}  input pipeline: {stream.how_started}, so the data continues "
                    "exactly where the run left it"
                )
            input_position.stream, input_position.first = stream, first
            return stream

        input_position = _InputPosition()
        phase = _phase_at(phase_plan, start_step)
        feature_lengths = dict(phase_plan[phase][1])
        train_iter = train_batches(phase, start_step)
        first_batch = next(train_iter, None)  # before the state is built: an empty task fails now
        input_pipeline.check_not_empty(first_batch, task_obj.name, "train", feature_lengths)
        train_iter = itertools.chain([first_batch], train_iter)
        if len(phase_plan) > 1:
            _log(
                f"step {start_step:>7}  phase {phase + 1} of {len(phase_plan)}: task feature "
                f"lengths {feature_lengths}"
            )

        # --- model state ----------------------------------------------------------------------
        rng = jax.random.key(seed)
        if start_step:
            state = checkpointer.restore(abstract, start_step)
            _log(f"Resumed from the checkpoint at step {start_step} in {checkpointer.directory}")
        elif checkpointing.init_checkpoint:
            params = params_io.load_pretrained(
                checkpointing.init_checkpoint,
                cfg,
                abstract.params,
                fresh_params=lambda: trainer.init_state(model, tx, rng, layout).params,
            )
            state = trainer.state_from_params(params, tx, layout)
            _log(f"Fine-tuning from the parameters in {checkpointing.init_checkpoint}")
        else:
            state = trainer.init_state(model, tx, rng, layout)
        train_step = trainer.make_train_step(
            model,
            tx,
            lr_fn,
            layout,
            optimizer.num_microbatches,
            health.nonfinite_policy,
            health.inject_nonfinite_at_steps,
        )
        spikes = run_health.LossSpikes(health.loss_spike_ratio)
        # Non-finite steps skipped before the current log window (the window's are read with it).
        nonfinite_logged = int(record.get("nonfinite_steps", 0))

        def save(state: trainer.TrainState) -> None:
            """Start saving `state` (in the background); say "saved" of the previous save,
            now that it is."""
            pending = sum(int(m["nonfinite"]) for m in jax.device_get(window))
            _save_input_position(int(state.step))
            _log_saved(
                checkpointer.save(
                    state,
                    cfg,
                    {
                        "data_order": order.to_json(),
                        "nonfinite_steps": nonfinite_logged + pending,
                        "vocabularies": vocabularies,
                    },
                )
            )
            kept = checkpointer.steps()
            if kept and jax.process_index() == 0:
                input_state.remove_input_states_before(model_dir, min(kept))

        def _save_input_position(step: int) -> None:
            """Save the input pipeline beside the checkpoint of `step`, if it stands at that step
            (after a non-finite stop it has read one batch more: a resume then skips instead)."""
            stream = input_position.stream
            if stream.position != step - input_position.first:
                return
            why_not = stream.save(input_state.input_state_dir(model_dir, step))
            if why_not and not input_position.warned:
                input_position.warned = True
                _log(
                    f"step {step:>7}  Note: the input pipeline's position could not be saved "
                    f"({why_not}); a resume will re-read the batches before its step instead."
                )

        eval_step = trainer.make_eval_step(model, layout)

        writer = metric_writers.create_default_writer(
            os.path.join(model_dir, "tensorboard"), just_logging=jax.process_index() > 0
        )
        tokens_per_batch = data.batch_size * sum(feature_lengths.values())
        peak, peak_source = hardware.peak_flops()
        _log(f"MFU is model FLOPs per second over {peak:.4g} FLOP/s ({peak_source})")
        best = BestCheckpoints(os.path.join(model_dir, "best"))

        # --- loop ----------------------------------------------------------------------------
        bar = logs.progress(total=train_steps, initial=start_step, desc="train")
        window: list[dict[str, jax.Array]] = []
        eval_data = None
        window_start = time.perf_counter()
        step = start_step
        preempted = profiling = False
        watcher.started()
        while step < train_steps:
            if _phase_at(phase_plan, step) != phase:
                phase = _phase_at(phase_plan, step)
                feature_lengths = dict(phase_plan[phase][1])
                tokens_per_batch = data.batch_size * sum(feature_lengths.values())
                train_iter, eval_data = train_batches(phase, step), None
                _log(
                    f"step {step:>7}  phase {phase + 1} of {len(phase_plan)}: task feature "
                    f"lengths {feature_lengths}"
                )
            batch = layout.global_batch(next(train_iter))
            if profile and step == profile[0]:
                trace_dir = _start_trace(model_dir)
                profiling = True
            with layout.context():
                state, metrics = train_step(state, batch, rng)
            step += 1
            # One scalar read per step.
            if health.nonfinite_policy == "stop" and int(metrics["nonfinite"]):
                bar.close()
                _stop_on_nonfinite(step, jax.device_get(metrics), state, save, checkpointer)
            if profiling and step == profile[1]:
                profiling = False
                jax.block_until_ready(state)
                _stop_trace(trace_dir, model_dir)
                _log(
                    f"step {step:>7}  profile of steps {profile[0]}-{profile[1]} written to "
                    f"{model_dir}/tensorboard/plugins/profile (TensorBoard's Profile tab)"
                )
            window.append(metrics)
            bar.update(1)
            if step % log_every == 0 or step == train_steps:
                per_step = jax.device_get(window)
                for offset, values in enumerate(per_step):
                    _report_health(step - len(per_step) + 1 + offset, values, spikes, writer)
                summary = _mean_metrics(per_step)
                nonfinite_logged += int(summary.pop("nonfinite", 0))
                summary["nonfinite_steps"] = nonfinite_logged
                elapsed = time.perf_counter() - window_start
                summary["tokens_per_s"] = tokens_per_batch * len(window) / elapsed
                summary["step_time_s"] = elapsed / len(window)
                step_flops = flops.train_step_flops(model.config, feature_lengths, data.batch_size)
                if step_flops:
                    summary["mfu"] = hardware.mfu(step_flops, summary["step_time_s"], peak)
                writer.write_scalars(step, {f"train/{k}": v for k, v in summary.items()})
                bar.set_postfix(loss=f"{summary['loss']:.3f}", refresh=False)
                _log(f"step {step:>7}  " + _format_metrics(summary))
                window, window_start = [], time.perf_counter()
            if evaluation.loss_every and (step % evaluation.loss_every == 0 or step == train_steps):
                if eval_data is None:
                    eval_data = load_eval_batches(
                        task_obj,
                        feature_lengths,
                        data.batch_size,
                        evaluation.loss_batches,
                        data.pack,
                        model,
                    )
                with layout.context():
                    eval_metrics = evaluate(eval_step, state.params, eval_data, layout, model)
                if eval_metrics:
                    writer.write_scalars(step, {f"eval/{k}": v for k, v in eval_metrics.items()})
                    _log(f"step {step:>7}  eval " + _format_metrics(eval_metrics))
            if eval_tasks and (step % evaluation.metrics_every == 0 or step == train_steps):
                task_metrics = _evaluate_tasks(
                    model,
                    state.params,
                    eval_tasks,
                    feature_lengths,
                    evaluation.metrics_batch_size,
                    evaluation.metrics_examples,
                )
                for name, values in task_metrics.items():
                    writer.write_scalars(step, {f"eval/{name}/{k}": v for k, v in values.items()})
                    _log(
                        f"step {step:>7}  {name}: "
                        + ", ".join(f"{k} {v:.2f}" for k, v in values.items())
                    )
                best.update(step, state.params, cfg, task_metrics)
            preempted = watcher.should_stop(step)
            if preempted or step % checkpointing.every == 0 or step == train_steps:
                save(state)
            if preempted:
                break
        bar.close()
        _log_saved(checkpointer.close())  # the watcher still guards this last save
        watcher.close()
        if preempted:
            _log(
                f"step {step:>7}  stopped by {watcher.signal_name}: rerun the same command to "
                "resume from this step"
            )
        writer.flush()

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
                feature_lengths,
                evaluation.num_predictions,
            )
        return state
    finally:
        if bar is not None:
            bar.close()  # before the error a failure prints, so that is the log's last line
        watcher.close()
        if lock is not None:
            lock.release()


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
    predict_fn = evaluation.make_predict_fn(
        model, feature_lengths["targets"], decoding.DecodeConfig()
    )
    return {
        name: evaluation.evaluate_task(
            predict_fn, params, name, "validation", feature_lengths, batch_size, max_examples
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
    step: int, values: Mapping[str, np.ndarray], spikes: run_health.LossSpikes, writer
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
    values: Mapping[str, np.ndarray],
    state: trainer.TrainState,
    save: Callable[[trainer.TrainState], None],
    checkpointer: train_state.Checkpointer,
) -> None:
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


@dataclasses.dataclass
class _InputPosition:
    """The input stream a checkpoint save records beside the state: the current phase's
    stream, the step that phase started at, and whether a failed save was already reported
    (once per run is enough)."""

    stream: train_data.HostBatches | None = None
    first: int = 0
    warned: bool = False


def _phase_start(plan: Sequence[tuple[int, Mapping[str, int]]], phase: int) -> int:
    return plan[phase - 1][0] if phase else 0


def _phase_at(plan: Sequence[tuple[int, Mapping[str, int]]], step: int) -> int:
    return next((i for i, (end, _) in enumerate(plan) if step < end), len(plan) - 1)


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
    return {k: float(v) for k, v in model.metrics(totals).items()}


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
    examples = list(evaluation.task_examples(task_obj, split, feature_lengths, count))
    if not examples:
        return
    vocab = task_obj.output_features["targets"].vocabulary
    predict_fn = evaluation.make_predict_fn(model, feature_lengths["targets"])
    predictions = evaluation.predict(
        predict_fn, params, examples, vocab, len(examples), feature_lengths["inputs"]
    )
    print("\nPredictions on validation examples (greedy decoding):")
    for i, (example, prediction) in enumerate(zip(examples, predictions)):
        print(f"\n[{i}] input:     {_shorten(prediction.inputs)}")
        print(f"    predicted: {_shorten(prediction.prediction)}")
        true = vocab.decode(_until_eos(example["targets"]))
        print(f"    true:      {_shorten(true)}")


def _until_eos(tokens: np.ndarray) -> list[int]:
    out = []
    for t in tokens.tolist():
        if t in (0, 1):
            break
        out.append(t)
    return out


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
