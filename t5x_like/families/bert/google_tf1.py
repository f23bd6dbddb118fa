"""Google's TF1 BERT release (google-research/bert): `bert_model.ckpt.{index,data-*}`,
`bert_config.json` and `vocab.txt`, as in `uncased_L-12_H-768_A-12.zip` -> our checkpoint.

The variable names are those of the release's `modeling.py` and `run_pretraining.py`
(`bert/encoder/layer_3/attention/self/query/kernel`, `cls/predictions/output_bias`, ...). Each
is renamed to the tensor transformers' `load_tf_weights_in_bert` fills, a `kernel` transposed
to torch's (out, in), and then read by the HuggingFace path (`hf.from_hf_tensors`), so both
imports share one name map and one set of shape checks. A checkpoint without the `cls/`
pretraining heads imports as an encoder only. Optimizer state (Adam's `adam_m`/`adam_v`, the
step) is skipped; any other variable the map does not know is refused, by its TF name.

The release's `gelu` is the tanh approximation (modeling.py); like transformers' conversion,
the import reads it as the exact erf GELU that the BERT paper's definition gives, and which
this codebase's BERT computes (the two differ by < 1e-3 on a unit input).
"""

from __future__ import annotations

import os
import re

import numpy as np

from t5x_like import storage
from t5x_like.checkpoints import hf_files, original_formats, tf_checkpoints
from t5x_like.errors import CheckpointError
from t5x_like.families.bert import hf

Tensor = np.ndarray

CONFIG = "bert_config.json"
VOCAB = "vocab.txt"
CHECKPOINT = "bert_model.ckpt"

# Variables of a pretraining run that only the optimizer needs (run_pretraining.py's
# AdamWeightDecayOptimizer), skipped as transformers' loader skips them.
_OPTIMIZER_STATE = {
    "adam_m",
    "adam_v",
    "AdamWeightDecayOptimizer",
    "AdamWeightDecayOptimizer_1",
    "global_step",
}
# The last part of a TF name -> of the HF name.
_LEAF = {
    "kernel": "weight",
    "gamma": "weight",
    "beta": "bias",
    "output_weights": "weight",
    "output_bias": "bias",
}


def is_optimizer_state(name: str) -> bool:
    return any(part in _OPTIMIZER_STATE for part in name.split("/"))


def hf_name(tf_name: str) -> str:
    """The transformers tensor a TF variable fills: 'bert/encoder/layer_3/output/dense/kernel'
    -> 'bert.encoder.layer.3.output.dense.weight' (as `load_tf_weights_in_bert` walks it)."""
    parts: list[str] = []
    for part in tf_name.split("/"):
        layer = re.fullmatch(r"layer_(\d+)", part)
        parts += ["layer", layer.group(1)] if layer else [_LEAF.get(part, part)]
    if tf_name.endswith("_embeddings"):
        parts.append("weight")
    return ".".join(parts)


def hf_tensors(variables: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The variables under transformers' names (kernels transposed to torch's layout), and a
    map back from each HF name to its TF name for messages."""
    tensors, tf_names = {}, {}
    for name, value in variables.items():
        renamed = hf_name(name)
        tensors[renamed] = value.T if name.endswith("/kernel") else value
        tf_names[renamed] = name
    return tensors, tf_names


def _check_names(tensors: dict[str, Tensor], tf_names: dict[str, str], cfg: hf.BertConfig) -> None:
    """Every variable is one BERT has, and every one BERT needs is there, by TF name."""
    heads = any(n.startswith("cls.") for n in tensors)
    wanted = {name for name, _, _ in hf.name_map(cfg, "bert.", heads_too=heads)}
    unknown = sorted(tf_names[n] for n in tensors if n not in wanted)
    if unknown:
        raise CheckpointError(
            f"The checkpoint holds {len(unknown)} variable(s) Google's BERT does not have: "
            f"{original_formats.listed(unknown)}. Only a pretraining "
            "checkpoint (bert/ with or without cls/) imports; a fine-tuned one's task head "
            "has no place in BertForPreTraining."
        )
    inverse = {hf_name(tf): tf for tf in _tf_names(cfg, heads)}
    missing = sorted(inverse[n] for n in wanted if n not in tensors)
    if missing:
        raise CheckpointError(
            f"The checkpoint lacks {len(missing)} variable(s) that {CONFIG} implies: "
            f"{original_formats.listed(missing)}; it may be another "
            "model's checkpoint, or its config another model's."
        )


def _tf_names(cfg: hf.BertConfig, heads: bool) -> list[str]:
    """The TF names of modeling.py's BERT (and run_pretraining.py's heads), for messages."""
    names = [f"bert/embeddings/{e}_embeddings" for e in ("word", "position", "token_type")]
    names += ["bert/embeddings/LayerNorm/gamma", "bert/embeddings/LayerNorm/beta"]
    for i in range(cfg.num_layers):
        layer = f"bert/encoder/layer_{i}"
        dense = [f"attention/self/{n}" for n in ("query", "key", "value")]
        dense += ["attention/output/dense", "intermediate/dense", "output/dense"]
        names += [f"{layer}/{d}/{w}" for d in dense for w in ("kernel", "bias")]
        norms = ("attention/output", "output")
        names += [f"{layer}/{n}/LayerNorm/{w}" for n in norms for w in ("gamma", "beta")]
    names += ["bert/pooler/dense/kernel", "bert/pooler/dense/bias"]
    if heads:
        names += [
            "cls/predictions/transform/dense/kernel",
            "cls/predictions/transform/dense/bias",
            "cls/predictions/transform/LayerNorm/gamma",
            "cls/predictions/transform/LayerNorm/beta",
            "cls/predictions/output_bias",
            "cls/seq_relationship/output_weights",
            "cls/seq_relationship/output_bias",
        ]
    return names


def _read_config(directory: str) -> dict:
    path = os.path.join(directory, CONFIG)
    if not storage.exists(path):
        raise CheckpointError(
            f"No {CONFIG} in {directory}; Google's BERT release has it beside "
            f"{CHECKPOINT}.* and {VOCAB}."
        )
    return hf_files.read_json(path, "fetch the release again.")


def _vocab(directory: str, vocab_size: int) -> tuple[str, bool]:
    """vocab.txt's path, checked to have the config's size, and whether it is lower-cased (a
    cased vocabulary has pieces with capitals; Google's uncased models were trained on text
    lower-cased by the tokenizer)."""
    from t5x_like.data import wordpiece

    path = os.path.join(directory, VOCAB)
    if not storage.exists(path):
        raise CheckpointError(
            f"No {VOCAB} in {directory}: the model's WordPiece vocabulary travels with its "
            "checkpoint (Google's release has it beside bert_config.json)."
        )
    try:
        pieces = wordpiece.read_vocab(path)
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    if len(pieces) != vocab_size:
        raise CheckpointError(
            f"{path} has {len(pieces)} pieces but {CONFIG} says vocab_size={vocab_size}: the "
            "vocabulary is not this checkpoint's. Use the vocab.txt released with it."
        )
    special = set(wordpiece.SPECIAL_TOKENS)
    cased = any(p not in special and p != p.lower() for p in pieces if not p.startswith("[unused"))
    return path, not cased


def recognises(path: str) -> bool:
    return storage.isdir(path) and storage.exists(os.path.join(path, CONFIG))


def load(path: str) -> original_formats.Imported:
    """(config, params, tokenizer files) from a release directory (or a checkpoint prefix in
    one, e.g. a pretraining run's `model.ckpt-100000` beside the release's config)."""
    directory = path if storage.isdir(path) else os.path.dirname(path)
    config = _read_config(directory)
    cfg = hf.config_from_hf(config, CONFIG)
    vocab_path, lower_case = _vocab(directory, cfg.vocab_size)
    prefix = tf_checkpoints.checkpoint_prefix(path, preferred=(CHECKPOINT,))
    tensors, tf_names = hf_tensors(tf_checkpoints.read_variables(prefix, is_optimizer_state))
    _check_names(tensors, tf_names, cfg)
    cfg, params = hf.from_hf_tensors(config, tensors, CONFIG)
    return original_formats.Imported(
        cfg,
        params,
        tokenizer_files={VOCAB: vocab_path},
        vocabulary={"type": "wordpiece", "file": VOCAB, "lower_case": lower_case},
    )


GOOGLE_BERT = original_formats.register(
    original_formats.OriginalFormat(
        name="Google BERT (TF1)",
        looks_for=f"{CONFIG}, {VOCAB} and a TF checkpoint such as {CHECKPOINT}.index",
        recognises=recognises,
        load=load,
    )
)
