"""Run a checkpoint on inputs and write its outputs as JSON lines.

    python -m t5x_like.infer --gin_file=gin_configs/models/t5_1_0/base.gin \\
        --gin_file=gin_configs/runs/infer.gin --gin.CHECKPOINT=/runs/glue \\
        --gin.INFER_TASK=glue_cola_v002 --gin.infer.input_file=inputs.txt

Inputs: a text file (one input a line, e.g. "cola sentence: ...") or JSONL with an `inputs`
field, tokenized with the task's vocabulary, or without a task with the tokenizer `convert`
kept beside the checkpoint; without `input_file`, the task's `split`.
Output (default CHECKPOINT/infer/<task or "inputs">.jsonl): {"inputs", "prediction", "score"}
per line (plus "target" for task examples). Decoding follows `DecodeConfig` (greedy by default; beam
search or sampling by binding it).
"""

from __future__ import annotations

if __name__ == "__main__":  # `python -m t5x_like.infer`: run it under that name
    from t5x_like.cli import main_of_module

    main_of_module("t5x_like.infer")

import json
import os
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence

import gin
import jax
import numpy as np

from t5x_like import cli, decoding, evaluation, input_pipeline, logs, storage
from t5x_like.checkpoints import tokenizer_files
from t5x_like.errors import ConfigError
from t5x_like.eval import default_output_dir, require_checkpoint, restore_model
from t5x_like.models import base

_JSONL_SUFFIXES = (".jsonl", ".json")


def _text_lines(path: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of each non-blank line, each checked to be UTF-8: a bad byte is
    named with its line and column (read as bytes: a text-mode read fails for the whole file
    without saying where)."""
    import tensorflow as tf

    with tf.io.gfile.GFile(path, "rb") as f:
        raw = f.read()
    for n, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            yield n, line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(
                f"{path}:{n}: not UTF-8 text (byte {line[e.start]:#04x} at column "
                f"{e.start + 1}); re-encode the file (e.g. `iconv -f latin1 -t utf-8`) or fix "
                "the line."
            ) from None


def _jsonl_inputs(path: str, n: int, line: str) -> str:
    """The `inputs` string of one JSON line, or an error naming the line."""
    hint = 'each line of a .jsonl file is one JSON object such as {"inputs": "..."}'
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{path}:{n}: not valid JSON ({e.msg} at column {e.colno}); {hint}."
        ) from None
    if not isinstance(record, dict) or "inputs" not in record:
        raise ConfigError(f"{path}:{n} has no 'inputs' field; {hint}.")
    if not isinstance(record["inputs"], str):
        raise ConfigError(
            f"{path}:{n}: 'inputs' is a JSON {type(record['inputs']).__name__}, "
            f"not a string; {hint}."
        )
    return record["inputs"]


class PromptLimit(NamedTuple):
    """The longest prompt a decoder-only model takes, and how to allow a longer one."""

    tokens: int
    how_to_raise: str


def read_inputs(
    path: str,
    vocabulary,
    inputs_length: int,
    add_eos: bool = True,
    prompt_limit: PromptLimit | None = None,
) -> Iterator[dict[str, Any]]:
    """Examples from a .txt (one input a line) or .jsonl (`inputs` field) file; EOS ends each
    input as in the tasks' examples, unless `add_eos=False` (a prompt to continue). Inputs
    longer than `inputs_length` are cut to it, as the tasks' are; with `prompt_limit`
    (a decoder-only model's prompt, whose continuation follows its last tokens, which a cut
    would drop) a longer one is refused, naming its line."""
    if not storage.exists(path):
        raise ConfigError(f"infer.input_file {path} does not exist.")
    for n, line in _text_lines(path):
        text = _jsonl_inputs(path, n, line) if path.endswith(_JSONL_SUFFIXES) else line
        ids = list(vocabulary.encode(text))
        if prompt_limit and len(ids) + int(add_eos) > prompt_limit.tokens:
            raise ConfigError(
                f"{path}:{n}: the prompt is {len(ids) + int(add_eos)} tokens, longer than the "
                f"{prompt_limit.tokens} of infer.task_feature_lengths['inputs'] (a cut prompt "
                f"would be continued from the wrong place); shorten the line, or "
                f"{prompt_limit.how_to_raise}."
            )
        if add_eos and vocabulary.eos_id is None:
            raise ConfigError(
                f"infer.add_eos=True, but the vocabulary ({type(vocabulary).__name__}) has no "
                "end-of-sequence id (GPT-1's BPE has none): set --gin.infer.add_eos=False."
            )
        ids = ids[: inputs_length - int(add_eos)] + ([vocabulary.eos_id] if add_eos else [])
        yield {"inputs": np.array(ids, np.int32), "inputs_pretokenized": text.encode()}


def read_all_inputs(
    path: str, vocabulary, inputs_length: int, add_eos: bool, prompt_limit: PromptLimit | None
) -> list[dict[str, Any]]:
    """Every example of the file, read before a checkpoint is restored (a bad line is found
    in seconds, not after the model is loaded); a file without any is refused."""
    examples = list(read_inputs(path, vocabulary, inputs_length, add_eos, prompt_limit))
    if not examples:
        raise ConfigError(
            f"infer.input_file {path} has no prompts: every line is blank. Give "
            'one input a line (.txt) or one {"inputs": ...} object a line '
            "(.jsonl)."
        )
    return examples


def _lengths_that_fit(limit: int, targets: int) -> dict[str, int]:
    """Feature lengths for a `limit`-position model: the targets kept when half the room or
    less, the rest for the prompt."""
    targets = min(targets, (limit - 1) // 2)
    return {"inputs": limit - 1 - targets, "targets": targets}


def check_decode_fits(model, feature_lengths: Mapping[str, int]) -> PromptLimit | None:
    """A decoder-only model with learned positions decodes start token + prompt (padded to
    'inputs') + 'targets' new tokens in one sequence: refuse feature lengths that pass its
    position table before anything is decoded (it was a traceback from inside the model).
    Returns the longest prompt then allowed (None for T5, whose inputs are cut to length
    as the tasks' are)."""
    if not model.PROMPT_SHARES_SEQUENCE:
        return None
    cfg = model.config
    limit = cfg.position_limit
    inputs, targets = feature_lengths["inputs"], feature_lengths["targets"]
    learned = limit is not None
    if learned and 1 + inputs + targets > limit:
        raise ConfigError(
            f"infer.task_feature_lengths={dict(feature_lengths)} decodes 1 + {inputs} + "
            f"{targets} = {1 + inputs + targets} positions (start token, prompt, new tokens), "
            f"but the model has {limit} learned positions ({type(cfg).__name__}."
            f"max_position_embeddings); make 'inputs' + 'targets' at most {limit - 1}, e.g. "
            f'--gin.infer.task_feature_lengths="{_lengths_that_fit(limit, targets)}".'
        )
    room = (
        (
            f" (up to {limit - 1 - targets} with 'targets': {targets}: the model has {limit} "
            f"learned positions, {type(cfg).__name__}.max_position_embeddings)"
        )
        if learned
        else ""
    )
    return PromptLimit(inputs, f"raise --gin.infer.task_feature_lengths 'inputs'{room}")


def _checkpoint_vocabulary(checkpoint: str, input_file: str | None):
    """Without a task, the vocabulary of the tokenizer saved with the checkpoint (`convert`
    keeps the imported model's own), for inputs from a file."""
    directory = tokenizer_files.find(checkpoint) if input_file else None
    vocabulary = tokenizer_files.vocabulary(directory) if directory else None
    if vocabulary is None:
        raise ConfigError(
            "infer.task (--gin.INFER_TASK=...) names the task whose vocabulary (and, without "
            "infer.input_file, whose examples) to use; without one, infer reads "
            "infer.input_file with the tokenizer saved beside the checkpoint, and "
            f"{checkpoint} has none (python -m t5x_like.convert keeps an imported model's)."
        )
    return vocabulary


@gin.configurable
def infer(
    checkpoint: str | None = None,
    task: str | None = None,
    split: str = "validation",
    input_file: str | None = None,
    output_file: str | None = None,
    task_feature_lengths: Mapping[str, int] = (("inputs", 512), ("targets", 114)),
    batch_size: int = 32,
    max_examples: int | None = None,
    model_class: Callable[[], Any] | None = None,
    add_eos: bool = True,
) -> list[dict[str, Any]]:
    """Predictions of `model_class` (T5 by default; `@DecoderOnlyModel` continues each input
    as its prompt, `add_eos=False` for a plain language model) for a file or a task split."""
    require_checkpoint(checkpoint)
    feature_lengths = dict(task_feature_lengths)
    task_obj = None
    tokenizer_files.offer_to_tasks(checkpoint)
    if task:
        task_obj = input_pipeline.resolve_task(task)
        if not input_file:
            input_pipeline.check_data_available(task_obj, split)
        input_pipeline.check_checkpoint_vocabulary(task_obj, checkpoint)
        vocabulary = task_obj.output_features["targets"].vocabulary
    else:
        vocabulary = _checkpoint_vocabulary(checkpoint, input_file)
    model = (model_class or base.default_model_class())()
    prompt_limit = check_decode_fits(model, feature_lengths)
    examples = (
        read_all_inputs(input_file, vocabulary, feature_lengths["inputs"], add_eos, prompt_limit)
        if input_file
        else evaluation.task_examples(task, split, feature_lengths, max_examples)
    )
    model, params = restore_model(checkpoint, lambda: model)
    predict_fn = evaluation.make_predict_fn(
        model, feature_lengths["targets"], decoding.DecodeConfig()
    )
    total = (
        len(examples)
        if input_file or task_obj is None
        else evaluation.expected_examples(task_obj, split, max_examples)
    )
    predictions = evaluation.predict(
        predict_fn,
        params,
        examples,
        vocabulary,
        batch_size,
        feature_lengths["inputs"],
        progress="infer",
        total=total,
        eos_id=model.eos_id,
    )
    records = [p.to_json() for p in predictions]
    output_file = output_file or os.path.join(
        default_output_dir(checkpoint, "infer"), f"{task or 'inputs'}.jsonl"
    )
    if jax.process_index() == 0:
        evaluation.write_jsonl(output_file, records)
    logs.log(f"wrote {len(records)} predictions to {output_file}")
    return records


def main(argv: Sequence[str] | None = None) -> int:
    return cli.run(infer, argv, __doc__.split("\n\n")[0])
