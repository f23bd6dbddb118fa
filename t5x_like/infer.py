"""Run a checkpoint on inputs and write its outputs as JSON lines.

    python -m t5x_like.infer --gin_file=gin_configs/models/t5_1_0/base.gin \\
        --gin_file=gin_configs/runs/infer.gin --gin.CHECKPOINT=/runs/glue \\
        --gin.INFER_TASK=glue_cola_v002 --gin.infer.input_file=inputs.txt

Inputs: a text file (one input a line, e.g. "cola sentence: ...") or JSONL with an `inputs`
field, tokenized with the task's vocabulary; without `input_file`, the task's `split`.
Output (default CHECKPOINT/infer/<task>.jsonl): {"inputs", "prediction", "score"} per line
(plus "target" for task examples). Decoding follows `DecodeConfig` (greedy by default; beam
search or sampling by binding it).
"""

from __future__ import annotations

if __name__ == "__main__":  # `python -m t5x_like.infer`: run it under that name
    from t5x_like.cli import main_of_module

    main_of_module("t5x_like.infer")

import json
import os
from typing import Any, Callable, Iterator, Mapping, Sequence

import gin
import jax
import numpy as np

from t5x_like import cli, decoding, evaluation, input_pipeline, storage
from t5x_like.config import ConfigError
from t5x_like.eval import default_output_dir, require_checkpoint, restore_model
from t5x_like.models.encoder_decoder import EncoderDecoderModel


def read_inputs(path: str, vocabulary, inputs_length: int,
                add_eos: bool = True) -> Iterator[dict[str, Any]]:
    """Examples from a .txt (one input a line) or .jsonl (`inputs` field) file; EOS ends each
    input as in the tasks' examples, unless `add_eos=False` (a prompt to continue)."""
    if not storage.exists(path):
        raise ConfigError(f"infer.input_file {path} does not exist.")
    for n, line in enumerate(storage.read_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        text = line
        if path.endswith((".jsonl", ".json")):
            record = json.loads(line)
            if "inputs" not in record:
                raise ConfigError(f"{path}:{n} has no 'inputs' field.")
            text = record["inputs"]
        ids = list(vocabulary.encode(text))[:inputs_length - int(add_eos)]
        ids += [vocabulary.eos_id] if add_eos else []
        yield {"inputs": np.array(ids, np.int32), "inputs_pretokenized": text.encode()}


@gin.configurable
def infer(checkpoint: str | None = None, task: str | None = None, split: str = "validation",
          input_file: str | None = None, output_file: str | None = None,
          task_feature_lengths: Mapping[str, int] = (("inputs", 512), ("targets", 114)),
          batch_size: int = 32, max_examples: int | None = None,
          model_class: Callable[[], Any] = EncoderDecoderModel,
          add_eos: bool = True) -> list[dict[str, Any]]:
    """Predictions of `model_class` (T5 by default; `@DecoderOnlyModel` continues each input
    as its prompt, `add_eos=False` for a plain language model) for a file or a task split."""
    if not task:
        raise ConfigError("infer.task (--gin.INFER_TASK=...) names the task whose vocabulary "
                          "(and, without infer.input_file, whose examples) to use.")
    require_checkpoint(checkpoint)
    feature_lengths = dict(task_feature_lengths)
    task_obj = input_pipeline.resolve_task(task)
    if not input_file:
        input_pipeline.check_data_available(task_obj, split)
    vocabulary = task_obj.output_features["targets"].vocabulary
    examples = (read_inputs(input_file, vocabulary, feature_lengths["inputs"], add_eos)
                if input_file
                else evaluation.task_examples(task, split, feature_lengths, max_examples))
    model, params = restore_model(checkpoint, model_class)
    predict_fn = evaluation.make_predict_fn(model, feature_lengths["targets"],
                                            decoding.DecodeConfig())
    predictions = evaluation.predict(predict_fn, params, examples, vocabulary, batch_size,
                                     feature_lengths["inputs"])
    records = [p.to_json() for p in predictions]
    output_file = output_file or os.path.join(default_output_dir(checkpoint, "infer"),
                                              f"{task}.jsonl")
    if jax.process_index() == 0:
        evaluation.write_jsonl(output_file, records)
    print(f"wrote {len(records)} predictions to {output_file}", flush=True)
    return records


def main(argv: Sequence[str] | None = None) -> int:
    return cli.run(infer, argv, __doc__.split("\n\n")[0])

