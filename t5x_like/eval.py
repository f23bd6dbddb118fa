"""Evaluate a checkpoint on tasks with their own metrics, writing predictions as JSON lines.

    python -m t5x_like.eval --gin_file=gin_configs/models/t5_1_0/base.gin \\
        --gin_file=gin_configs/runs/eval.gin --gin.CHECKPOINT=/runs/glue \\
        --gin.EVAL_TASK=glue_v002_proportional

A mixture evaluates every task in it that has metrics and the split. Output (default
CHECKPOINT/eval): `<task>_<split>.jsonl` (inputs, prediction, score, target per example) and
`metrics.json`. Decoding follows `DecodeConfig` (greedy unless bound otherwise, e.g.
`--gin.DecodeConfig.method=beam --gin.DecodeConfig.beam_size=4 --gin.DecodeConfig.alpha=0.6`).

A BERT fine-tuned head (`--gin.evaluate.model_class=@BertClassifierModel` and its
`num_labels`, `@BertSpanModel` for SQuAD, ...) is scored on its predictions directly (class
ids, scores, spans or tags), with `metrics.json` only.
"""

from __future__ import annotations

if __name__ == "__main__":  # `python -m t5x_like.eval`: run it under that name
    from t5x_like.cli import main_of_module

    main_of_module("t5x_like.eval")

import copy
import json
import os
from typing import Any, Callable, Mapping, Sequence

import gin
import jax
import seqio

from t5x_like import (
    classifier_eval,
    cli,
    decoding,
    evaluation,
    input_pipeline,
    logs,
    partitioning,
    storage,
)
from t5x_like.checkpoints import params_io, tokenizer_files
from t5x_like.errors import ConfigError
from t5x_like.models import base
from t5x_like.models.base import Model, unbox


def require_checkpoint(checkpoint: str | None) -> None:
    """Fail before any data is read or model built when no checkpoint is named."""
    if not checkpoint:
        raise ConfigError(
            "No checkpoint: pass --gin.CHECKPOINT=/path/to/MODEL_DIR (or a "
            "directory written by python -m t5x_like.convert)."
        )


def with_checkpoint_conventions(model: Model, checkpoint: str) -> Model:
    """A decoder-only model for a checkpoint imported with GPT BPE decodes with that model's
    own start token, EOS and attention (`tokenizer_files.model_conventions`): a copy of
    `model` with them set (others are returned as they are)."""
    if not model.PROMPT_SHARES_SEQUENCE:
        return model
    conventions = tokenizer_files.model_conventions(storage.resolve(checkpoint))
    if conventions is None:
        return model
    model = copy.copy(model)
    for name, value in conventions.items():
        setattr(model, name, value)
    logs.log(f"decoding with the imported model's own conventions: {conventions}")
    return model


def restore_model(
    checkpoint: str | None, model_class: Callable[[], Model] | None = None
) -> tuple[Model, Any]:
    """The gin-configured model and the checkpoint's parameters, sharded over all devices by
    the configured mesh and rules (checked against the checkpoint's config first). Without a
    `model_class`, T5's (`base.DEFAULT_MODEL_CLASS`)."""
    require_checkpoint(checkpoint)
    model = with_checkpoint_conventions((model_class or base.default_model_class())(), checkpoint)
    mesh = partitioning.make_mesh()
    rules = partitioning.logical_axis_rules(num_partitions=partitioning.model_axis_size(mesh))
    boxed = model.abstract_params()
    shardings = partitioning.param_shardings(boxed, mesh, rules)
    abstract = jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), unbox(boxed), shardings
    )
    return model, params_io.load_pretrained(checkpoint, model.config, abstract)


def default_output_dir(checkpoint: str, name: str) -> str:
    return os.path.join(storage.resolve(checkpoint), name)


@gin.configurable
def evaluate(
    checkpoint: str | None = None,
    task: str = "glue_v002_proportional",
    split: str = "validation",
    task_feature_lengths: Mapping[str, int] = (("inputs", 512), ("targets", 114)),
    batch_size: int = 32,
    max_examples: int | None = None,
    output_dir: str | None = None,
    tfds_data_dir: str | None = None,
    model_class: Callable[[], Model] | None = None,
) -> dict[str, dict[str, float]]:
    """Metrics per task; predictions and metrics written under `output_dir`."""
    require_checkpoint(checkpoint)
    feature_lengths = dict(task_feature_lengths)
    if tfds_data_dir:
        seqio.set_tfds_data_dir_override(tfds_data_dir)
    tokenizer_files.offer_to_tasks(checkpoint)
    input_pipeline.check_data_available(input_pipeline.resolve_task(task), split)
    task_names = evaluation.evaluable_tasks(task, split)
    if not task_names:
        raise ConfigError(f"{task!r} has no task with metrics and a {split!r} split.")
    input_pipeline.check_checkpoint_vocabulary(input_pipeline.resolve_task(task), checkpoint)
    model, params = restore_model(checkpoint, model_class)
    output_dir = output_dir or default_output_dir(checkpoint, "eval")
    results = {}
    if model.PROMPT_FEATURE is None:  # a head that predicts labels, not text
        for name in task_names:
            results[name] = classifier_eval.evaluate_task(
                model, params, name, split, feature_lengths, batch_size, max_examples
            )
            logs.log(f"{name}: " + ", ".join(f"{k} {v:.2f}" for k, v in results[name].items()))
        _write_metrics(output_dir, results)
        return results
    predict_fn = evaluation.make_predict_fn(
        model, feature_lengths["targets"], decoding.DecodeConfig()
    )
    for name in task_names:
        metrics, predictions = evaluation.evaluate_task(
            predict_fn,
            params,
            name,
            split,
            feature_lengths,
            batch_size,
            max_examples,
            show_progress=True,
            eos_id=model.eos_id,
        )
        results[name] = metrics
        if jax.process_index() == 0:
            evaluation.write_jsonl(
                os.path.join(output_dir, f"{name}_{split}.jsonl"),
                (p.to_json() for p in predictions),
            )
        logs.log(
            f"{name} ({len(predictions)} examples): "
            + ", ".join(f"{k} {v:.2f}" for k, v in metrics.items())
        )
    _write_metrics(output_dir, results)
    return results


def _write_metrics(output_dir: str, results: Mapping[str, Mapping[str, float]]) -> None:
    if jax.process_index() == 0:
        storage.write_text(os.path.join(output_dir, "metrics.json"), json.dumps(results, indent=2))


def main(argv: Sequence[str] | None = None) -> int:
    return cli.run(evaluate, argv, __doc__.split("\n\n")[0])
