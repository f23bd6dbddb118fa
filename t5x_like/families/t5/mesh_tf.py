"""Mesh-TensorFlow T5 checkpoints (the T5 paper's released `gs://t5-data/pretrained_models/*`,
T5 v1.0 and v1.1): a TF1 checkpoint with `encoder/block_000/layer_000/SelfAttention/q`-style
names, usually with `operative_config.gin` beside it -> our checkpoint.

Each variable is renamed to the tensor transformers' `load_tf_weights_in_t5` fills (Mesh-TF
stores every matrix as (in, out), so all but the embedding are transposed to torch's layout)
and read by the HuggingFace path (`hf.from_hf_tensors`), so both imports share one name map and
one set of shape checks. Adafactor's slot variables (`*_slot_vc`, `_slot_vr`, `_slot_v`) and
the step are skipped; any other unknown variable is refused by its TF name.

The model's sizes come from the shapes (width and vocabulary from `shared/embedding`, heads and
buckets from the relative attention bias, depth from the blocks), the output layer from whether
`decoder/logits/kernel` exists (v1.1: untied; v1.0: tied, scaled by d_model**-0.5), and the
feed-forward activation from `operative_config.gin`'s `DenseReluDense.activation`, or, without
that file, from the layer's shape: one `wi` is v1.0's ReLU, `wi_0`/`wi_1` v1.1's gated GELU.
A SentencePiece model in the directory (`sentencepiece.model` or `spiece.model`) is kept as the
checkpoint's tokenizer; the released checkpoints keep theirs apart, in
`gs://t5-data/vocabs/cc_all.32000/`, and should be given it beside them.
"""

from __future__ import annotations

import ast
import os
import re

import numpy as np

from t5x_like import logs, storage
from t5x_like.checkpoints import original_formats, tf_checkpoints
from t5x_like.errors import CheckpointError
from t5x_like.families.t5 import hf

Tensor = np.ndarray

OPERATIVE_CONFIG = "operative_config.gin"
SENTENCEPIECE_FILES = ("sentencepiece.model", "spiece.model")
# Mesh-TF's DenseReluDense.activation values -> transformers' feed_forward_proj.
_ACTIVATIONS = {
    ("relu",): "relu",
    ("gelu",): "gelu_new",  # mesh_tensorflow's gelu is the tanh approximation
    ("gelu", "linear"): "gated-gelu",
    ("relu", "linear"): "gated-relu",
}
_SKIPPED = {"global_step", "adam_m", "adam_v", "AdamWeightDecayOptimizer"}

_BLOCK = re.compile(r"(encoder|decoder)/block_(\d+)/layer_(\d+)/(.+)")
_IN_BLOCK = {
    # the rest of a block variable's name -> of transformers' (None: the same, '/' -> '.')
    "layer_norm/scale": "layer_norm.weight",
    "rms_norm/scale": "layer_norm.weight",
}
_MODULES = re.compile(
    r"(SelfAttention|EncDecAttention)/(q|k|v|o|relative_attention_bias)"
    r"|DenseReluDense/(wi|wi_0|wi_1|wo)/kernel"
)


def is_optimizer_state(name: str) -> bool:
    parts = name.split("/")
    return "_slot_" in parts[-1] or any(p in _SKIPPED for p in parts)


def hf_name(tf_name: str) -> str | None:
    """The transformers tensor a Mesh-TF variable fills, or None for a name T5 does not have."""
    if tf_name == "shared/embedding":
        return "shared.weight"
    if tf_name == "decoder/logits/kernel":
        return "lm_head.weight"
    stack_norm = re.fullmatch(r"(encoder|decoder)/(final_layer_norm|rms_norm)/scale", tf_name)
    if stack_norm:
        return f"{stack_norm.group(1)}.final_layer_norm.weight"
    block = _BLOCK.fullmatch(tf_name)
    if not block:
        return None
    stack, i, j, rest = block.groups()
    prefix = f"{stack}.block.{int(i)}.layer.{int(j)}"
    if rest in _IN_BLOCK:
        return f"{prefix}.{_IN_BLOCK[rest]}"
    if not _MODULES.fullmatch(rest):
        return None
    return f"{prefix}.{rest.removesuffix('/kernel').replace('/', '.')}.weight"


def hf_tensors(variables: dict[str, Tensor]) -> dict[str, Tensor]:
    """The variables under transformers' names, every matrix but the embedding transposed."""
    unknown = sorted(name for name in variables if hf_name(name) is None)
    if unknown:
        raise CheckpointError(
            f"The checkpoint holds {len(unknown)} variable(s) Mesh-TensorFlow's T5 does not "
            f"have: {original_formats.listed(unknown)}. Only T5 "
            "v1.0 / v1.1 encoder-decoder checkpoints import."
        )
    return {
        str(hf_name(name)): value if name == "shared/embedding" else value.T
        for name, value in variables.items()
    }


def _activation(directory: str, gated: bool) -> str:
    """feed_forward_proj from operative_config.gin, or from the layer's shape without one."""
    path = os.path.join(directory, OPERATIVE_CONFIG)
    if not storage.exists(path):
        logs.log(
            f"No {OPERATIVE_CONFIG} beside the checkpoint: reading its feed-forward layer as "
            f"{'v1.1 gated GELU (wi_0, wi_1)' if gated else 'v1.0 ReLU (one wi)'}."
        )
        return "gated-gelu" if gated else "relu"
    found = set()
    for line in storage.read_text(path).splitlines():
        binding = re.fullmatch(r"\s*(?:\w+/)?DenseReluDense\.activation\s*=\s*(.+?)\s*", line)
        if binding:
            try:
                value = ast.literal_eval(binding.group(1))
            except (ValueError, SyntaxError):
                value = binding.group(1)
            found.add(tuple(value) if isinstance(value, (list, tuple)) else (value,))
    if not found:
        return "gated-gelu" if gated else "relu"
    unsupported = sorted(str(list(a)) for a in found if a not in _ACTIVATIONS)
    if unsupported or len(found) > 1:
        raise CheckpointError(
            f"{path} sets DenseReluDense.activation = {', '.join(str(list(a)) for a in found)}; "
            f"this T5 has one of {', '.join(str(list(a)) for a in _ACTIVATIONS)} in both stacks."
        )
    (activation,) = found
    if (len(activation) == 2) != gated:
        raise CheckpointError(
            f"{path} sets DenseReluDense.activation = {list(activation)}, but the checkpoint's "
            f"feed-forward layer has {'wi_0/wi_1' if gated else 'one wi'}: the config is "
            "another model's."
        )
    return _ACTIVATIONS[activation]


def hf_config(variables: dict[str, Tensor], directory: str) -> dict:
    """transformers' T5 config.json for the checkpoint, from its shapes (and activation)."""

    def shape(name: str) -> tuple[int, ...]:
        if name not in variables:
            raise CheckpointError(
                f"The checkpoint has no {name}; a Mesh-TensorFlow T5 checkpoint has it. Is this "
                "an encoder-decoder T5 checkpoint, and complete?"
            )
        return tuple(variables[name].shape)

    vocab, d_model = shape("shared/embedding")
    heads, buckets = shape("encoder/block_000/layer_000/SelfAttention/relative_attention_bias")
    inner = shape("encoder/block_000/layer_000/SelfAttention/q")[1]
    gated = "encoder/block_000/layer_001/DenseReluDense/wi_0/kernel" in variables
    wi = "wi_0" if gated else "wi"
    d_ff = shape(f"encoder/block_000/layer_001/DenseReluDense/{wi}/kernel")[1]
    untied = "decoder/logits/kernel" in variables

    def blocks(stack: str) -> int:
        return len({m.group(2) for n in variables if (m := _BLOCK.fullmatch(n)) and m[1] == stack})

    if inner % heads:
        raise CheckpointError(
            f"The attention is {inner} wide with {heads} heads (from the relative attention "
            "bias); T5's width is a multiple of its heads."
        )
    return {
        "model_type": "t5",
        "vocab_size": vocab,
        "d_model": d_model,
        "d_kv": inner // heads,
        "d_ff": d_ff,
        "num_heads": heads,
        "num_layers": blocks("encoder"),
        "num_decoder_layers": blocks("decoder"),
        "relative_attention_num_buckets": buckets,
        "relative_attention_max_distance": 128,  # Mesh-TF's default, the paper's
        "feed_forward_proj": _activation(directory, gated),
        "tie_word_embeddings": not untied,
        "scale_decoder_outputs": not untied,
        "layer_norm_epsilon": 1e-6,
    }


def _directory(path: str) -> str:
    return path if storage.isdir(path) else os.path.dirname(path)


def recognises(path: str) -> bool:
    """A TF checkpoint (or a directory of one) with T5's shared embedding, and no BERT config."""
    directory = _directory(path)
    if storage.exists(os.path.join(directory, "bert_config.json")):
        return False
    try:
        prefix = tf_checkpoints.checkpoint_prefix(path)
        names = tf_checkpoints.variable_names(prefix)
    except Exception:  # noqa: BLE001 - not a (readable) TF checkpoint: not this format
        return False
    return "shared/embedding" in names


def load(path: str) -> original_formats.Imported:
    prefix = tf_checkpoints.checkpoint_prefix(path)
    variables = tf_checkpoints.read_variables(prefix, is_optimizer_state)
    directory = _directory(path)
    cfg, params = hf.from_hf_tensors(hf_config(variables, directory), hf_tensors(variables))
    return original_formats.with_sentencepiece(
        cfg,
        params,
        directory,
        SENTENCEPIECE_FILES,
        "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model",
    )


MESH_TF_T5 = original_formats.register(
    original_formats.OriginalFormat(
        name="Mesh-TensorFlow T5",
        looks_for="a TF checkpoint (checkpoint + model.ckpt-N.index) with shared/embedding and "
        "encoder/block_000/... variables",
        recognises=recognises,
        load=load,
    )
)
