"""Train a T5 model from gin files.

    python -m t5x_like.train --gin_file=gin_configs/models/t5_1_1/small.gin \\
        --gin_file=gin_configs/runs/pretrain.gin --gin.MODEL_DIR=/tmp/run --gin.TRAIN_STEPS=1000

Later files override earlier ones and `--gin.KEY=VALUE` bindings override files; plain strings
need no quotes. The run reads like a recipe, in sections: checks -> mesh -> data -> model ->
optimizer -> checkpoint (resume) -> loop -> predictions. Rerunning the same command resumes
from the newest checkpoint in MODEL_DIR.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Mapping, Sequence

import gin
import jax
import numpy as np
import seqio
from clu import metric_writers
from tqdm import tqdm

from t5x_like import config as config_lib
from t5x_like import (cli, decoding, evaluation, input_pipeline, optimizers, partitioning,
                      trainer)
from t5x_like.checkpoints import params_io
from t5x_like.models.encoder_decoder import EncoderDecoderModel
from t5x_like.models.t5 import T5Config


def _check_model_dir(model_dir: str | None) -> str:
    if not model_dir:
        raise config_lib.ConfigError("No model directory: pass --gin.MODEL_DIR=/path/for/this/run.")
    model_dir = os.path.abspath(os.path.expanduser(model_dir))
    try:
        os.makedirs(model_dir, exist_ok=True)
        probe = os.path.join(model_dir, ".write_test")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise config_lib.ConfigError(f"MODEL_DIR {model_dir} is not writable ({e}); choose another "
                              "--gin.MODEL_DIR.") from e
    return model_dir


def _check_resume_config(checkpointer: trainer.Checkpointer, cfg: T5Config) -> None:
    saved = checkpointer.restore_config()
    if saved != cfg:
        diffs = [f"{k}: checkpoint {v!r} vs config {getattr(cfg, k)!r}"
                 for k, v in saved.to_json().items() if v != cfg.to_json()[k]]
        raise config_lib.ConfigError(
            f"MODEL_DIR {checkpointer.directory} holds a checkpoint of a different model "
            f"({'; '.join(diffs)}). Use another --gin.MODEL_DIR or the checkpoint's model gin "
            "file.")


def _write_text(path: str, text: str) -> None:
    if jax.process_index() == 0:
        with open(path, "w") as f:
            f.write(text)


@gin.configurable
def train(
    model_dir: str | None = None,
    task: str = "offline_span_corruption",
    task_feature_lengths: Mapping[str, int] = (("inputs", 512), ("targets", 114)),
    batch_size: int = 128,
    train_steps: int = 2**19,
    warmup_steps: int = 10_000,
    learning_rate_scale: float = 1.0,
    eval_every: int = 1000,
    eval_batches: int = 10,
    checkpoint_every: int = 1000,
    keep_checkpoints: int | None = 5,
    log_every: int = 100,
    seed: int = 0,
    pack: bool = True,
    tfds_data_dir: str | None = None,
    num_microbatches: int = 1,
    num_predictions: int = 4,
    init_checkpoint: str | None = None,
    learning_rate_schedule: str = "inverse_sqrt",
    constant_learning_rate: float = 0.001,
    metrics_eval_every: int = 0,
    metrics_eval_examples: int | None = None,
    metrics_eval_batch_size: int = 32,
) -> trainer.TrainState:
    """Pretrain or fine-tune, and return the final train state.

    The defaults are the T5 paper's baseline (2^19 steps of 128 x 512 packed tokens, AdaFactor,
    1/sqrt(max(step, 10^4))). Fine-tuning (gin_configs/runs/finetune.gin) starts from
    `init_checkpoint`'s parameters with a fresh optimizer and `learning_rate_schedule=
    'constant'` at 0.001, and every `metrics_eval_every` steps decodes each task's validation
    examples, scores them with the task's metrics (TensorBoard `eval/<task>/<metric>`) and keeps
    the best parameters per task in MODEL_DIR/best/<task>. Exact data-order resume comes later:
    a resumed run reseeds the data pipeline with the step, so it sees fresh examples rather than
    the killed run's next ones.
    """
    feature_lengths = dict(task_feature_lengths)

    # --- checks, before anything expensive -----------------------------------------------
    model_dir = _check_model_dir(model_dir)
    if tfds_data_dir:
        seqio.set_tfds_data_dir_override(tfds_data_dir)
    task_obj = input_pipeline.resolve_task(task)
    input_pipeline.check_data_available(task_obj, "train")
    model = EncoderDecoderModel(T5Config())
    cfg = model.config
    input_pipeline.check_vocabulary(task_obj, cfg.vocab_size)
    mesh = partitioning.make_mesh()
    rules = partitioning.logical_axis_rules(num_partitions=partitioning.model_axis_size(mesh))
    partitioning.check_rules_match_mesh(rules, mesh)
    partitioning.check_batch_size(batch_size, mesh, num_microbatches, rules)
    lr_fn = optimizers.learning_rate_schedule(learning_rate_schedule, warmup_steps,
                                              learning_rate_scale, constant_learning_rate)
    optimizer = optimizers.t5_adafactor(lr_fn)
    layout = trainer.make_layout(model, optimizer, mesh, rules)  # abstract: cheap
    abstract = trainer.abstract_state(model, optimizer, layout)
    checkpointer = trainer.Checkpointer(model_dir, keep_checkpoints)
    start_step = checkpointer.latest_step() or 0
    if start_step:
        _check_resume_config(checkpointer, cfg)
    elif init_checkpoint:
        params_io.check_compatible(
            params_io.restore_config(params_io.checkpoint_directory(init_checkpoint)), cfg,
            init_checkpoint)
    eval_tasks = (evaluation.evaluable_tasks(task) if metrics_eval_every else [])

    print(f"Operative config (saved to {model_dir}/config.gin):\n{gin.operative_config_str()}",
          flush=True)
    _write_text(os.path.join(model_dir, "config.gin"), gin.operative_config_str())
    table, _ = partitioning.parameter_table(layout.boxed_params, layout.state_shardings.params)
    state_bytes = partitioning.state_bytes_per_device(abstract, layout.state_shardings)
    report = (f"{partitioning.describe_mesh(mesh)}; rules {list(rules)}\n{table}\n"
              f"parameters + optimizer state per device: {state_bytes:,} bytes")
    _log(report)
    _write_text(os.path.join(model_dir, "partitioning.txt"), report + "\n")

    # --- data --------------------------------------------------------------------------
    train_ds = input_pipeline.get_dataset(task, feature_lengths, batch_size, "train",
                                          shuffle=True, seed=seed + start_step, num_epochs=None,
                                          pack=pack)
    train_iter = train_ds.as_numpy_iterator()

    # --- model state ----------------------------------------------------------------------
    rng = jax.random.key(seed)
    if start_step:
        state = checkpointer.restore(abstract, start_step)
        _log(f"Resumed from the checkpoint at step {start_step} in {checkpointer.directory}")
    elif init_checkpoint:
        params = params_io.load_pretrained(init_checkpoint, cfg, abstract.params)
        state = trainer.state_from_params(params, optimizer, layout)
        _log(f"Fine-tuning from the parameters in {init_checkpoint}")
    else:
        state = trainer.init_state(model, optimizer, rng, layout)
    train_step = trainer.make_train_step(model, optimizer, lr_fn, layout, num_microbatches)
    eval_step = trainer.make_eval_step(model, layout)

    writer = metric_writers.create_default_writer(
        os.path.join(model_dir, "tensorboard"), just_logging=jax.process_index() > 0)
    tokens_per_batch = batch_size * sum(feature_lengths.values())
    best = BestCheckpoints(os.path.join(model_dir, "best"))

    # --- loop ----------------------------------------------------------------------------
    bar = tqdm(total=train_steps, initial=start_step, desc="train", dynamic_ncols=True,
               mininterval=1.0 if sys.stderr.isatty() else 30.0)
    window: list[dict[str, jax.Array]] = []
    eval_data = None
    window_start = time.perf_counter()
    step = start_step
    while step < train_steps:
        batch = layout.global_batch(next(train_iter))
        with layout.context():
            state, metrics = train_step(state, batch, rng)
        step += 1
        window.append(metrics)
        bar.update(1)
        if step % log_every == 0 or step == train_steps:
            summary = _mean_metrics(window)
            elapsed = time.perf_counter() - window_start
            summary["tokens_per_s"] = tokens_per_batch * len(window) / elapsed
            writer.write_scalars(step, {f"train/{k}": v for k, v in summary.items()})
            bar.set_postfix(loss=f"{summary['loss']:.3f}", refresh=False)
            _log(f"step {step:>7}  loss {summary['loss']:.4f}  "
                 f"accuracy {summary['accuracy']:.3f}  lr {summary['learning_rate']:.2e}  "
                 f"tokens/s {summary['tokens_per_s']:,.0f}")
            window, window_start = [], time.perf_counter()
        if eval_every and (step % eval_every == 0 or step == train_steps):
            if eval_data is None:
                eval_data = load_eval_batches(task, feature_lengths, batch_size, eval_batches,
                                              pack)
            with layout.context():
                eval_metrics = evaluate(eval_step, state.params, eval_data, layout)
            if eval_metrics:
                writer.write_scalars(step, {f"eval/{k}": v for k, v in eval_metrics.items()})
                _log(f"step {step:>7}  eval loss {eval_metrics['loss']:.4f}  "
                     f"eval accuracy {eval_metrics['accuracy']:.3f}")
        if eval_tasks and (step % metrics_eval_every == 0 or step == train_steps):
            task_metrics = _evaluate_tasks(model, state.params, eval_tasks, feature_lengths,
                                           metrics_eval_batch_size, metrics_eval_examples)
            for name, values in task_metrics.items():
                writer.write_scalars(step, {f"eval/{name}/{k}": v for k, v in values.items()})
                _log(f"step {step:>7}  {name}: " + ", ".join(f"{k} {v:.2f}"
                                                            for k, v in values.items()))
            best.update(step, state.params, cfg, task_metrics)
        if step % checkpoint_every == 0 or step == train_steps:
            checkpointer.save(state, cfg)
            _log(f"step {step:>7}  checkpoint saved")
    bar.close()
    checkpointer.close()
    writer.flush()

    if num_predictions and jax.process_index() == 0:
        show_predictions(model, jax.device_get(state.params), task, feature_lengths,
                         num_predictions)
    return state


def _evaluate_tasks(model: EncoderDecoderModel, params, task_names: Sequence[str],
                    feature_lengths: Mapping[str, int], batch_size: int,
                    max_examples: int | None) -> dict[str, dict[str, float]]:
    """Decode (DecodeConfig from gin; greedy by default) and score each task's validation set."""
    predict_fn = evaluation.make_predict_fn(model, feature_lengths["targets"],
                                            decoding.DecodeConfig())
    return {name: evaluation.evaluate_task(predict_fn, params, name, "validation",
                                           feature_lengths, batch_size, max_examples)[0]
            for name in task_names}


class BestCheckpoints:
    """The best parameters per task (by the first metric the task reports, higher is better),
    as the paper reports the best validation checkpoint of each task."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.best: dict[str, dict] = {}
        record = os.path.join(directory, "best.json")
        if os.path.exists(record):
            with open(record) as f:
                self.best = json.load(f)

    def update(self, step: int, params, cfg: T5Config,
               task_metrics: Mapping[str, Mapping[str, float]]) -> None:
        changed = False
        for name, values in task_metrics.items():
            if not values:
                continue
            key, value = next(iter(values.items()))
            if name in self.best and self.best[name]["value"] >= value:
                continue
            # One step kept per task: orbax drops the previous best once the new one is written.
            params_io.save_params(os.path.join(self.directory, name), params, cfg, step, keep=1)
            self.best[name] = {"step": step, "metric": key, "value": value,
                               "metrics": dict(values)}
            changed = True
        if changed and jax.process_index() == 0:
            with open(os.path.join(self.directory, "best.json"), "w") as f:
                json.dump(self.best, f, indent=2)


def _log(message: str) -> None:
    """A line above the progress bar, flushed at once (stdout may be a file or a pipe)."""
    tqdm.write(message)
    sys.stdout.flush()


def _mean_metrics(window: Sequence[dict[str, jax.Array]]) -> dict[str, float]:
    stacked = jax.device_get(window)
    return {k: float(np.mean([m[k] for m in stacked])) for k in stacked[0]}


def load_eval_batches(task: str, feature_lengths: Mapping[str, int], batch_size: int,
                      num_batches: int, pack: bool) -> list[dict[str, np.ndarray]]:
    """The first `num_batches` validation batches, read once and reused at every evaluation
    (a fixed set, so evaluations are comparable); empty if the task has no validation split."""
    if "validation" not in input_pipeline.resolve_task(task).splits:
        return []
    ds = input_pipeline.get_dataset(task, feature_lengths, batch_size, "validation",
                                    shuffle=False, seed=0, num_epochs=1, pack=pack)
    return list(ds.take(num_batches).as_numpy_iterator())


def evaluate(eval_step, params, batches: Sequence[dict[str, np.ndarray]],
             layout: trainer.Layout) -> dict[str, float]:
    """Per-token loss and accuracy over `batches`."""
    totals: dict[str, float] = {}
    for batch in batches:
        sums = jax.device_get(eval_step(params, layout.global_batch(batch)))
        for k, v in sums.items():
            totals[k] = totals.get(k, 0.0) + float(v)
    if not totals:
        return {}
    weight = max(totals["weight_sum"], 1.0)
    return {"loss": totals["loss_sum"] / weight, "accuracy": totals["correct"] / weight}


def show_predictions(model: EncoderDecoderModel, params, task: str,
                     feature_lengths: Mapping[str, int], count: int) -> None:
    """Print validation inputs with the model's greedy spans beside the true ones."""
    task_obj = input_pipeline.resolve_task(task)
    split = "validation" if "validation" in task_obj.splits else "train"
    ds = input_pipeline.get_dataset(task, feature_lengths, count, split, shuffle=False, seed=0,
                                    num_epochs=1, pack=False)
    batch = next(ds.as_numpy_iterator(), None)
    if batch is None:
        return
    predict = jax.jit(lambda p, b: model.predict_batch(p, b, feature_lengths["targets"]))
    predicted = np.asarray(predict(params, {"encoder_input_tokens": batch["encoder_input_tokens"]}))
    vocab = task_obj.output_features["targets"].vocabulary
    print("\nPredictions on validation examples (greedy decoding):")
    for i in range(len(predicted)):
        inputs = vocab.decode(_until_eos(batch["encoder_input_tokens"][i]))
        print(f"\n[{i}] input:     {_shorten(inputs)}")
        print(f"    predicted: {_shorten(vocab.decode(_until_eos(predicted[i])))}")
        true = vocab.decode(_until_eos(batch["decoder_target_tokens"][i]))
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
    return cli.run(train, argv, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    sys.exit(main())
