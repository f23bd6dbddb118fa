"""HuggingFace BERT checkpoints (BertForPreTraining / BertModel / fine-tuned BertFor* layouts)
<-> our parameters.

Every HF tensor maps to one of our parameters through a reversible transform, so the same table
imports and exports. Reading is `hf_files.read_tensors` (safetensors, or a weights-only `.bin`: no
code runs); unknown, missing or mis-shaped tensors are errors that name the tensor.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import jax.numpy as jnp
import numpy as np

from t5x_like.checkpoints import hf_families, hf_files
from t5x_like.checkpoints.hf_files import (
    TransformPair,
    from_heads,
    read_config,
    read_tensors,
    same,
    to_heads,
    transposed,
)
from t5x_like.errors import CheckpointError
from t5x_like.families.bert import network as bert
from t5x_like.families.bert.network import BertConfig

Tensor = np.ndarray
Params = dict[str, Any]


def config_from_hf(hf: dict[str, Any], source: str = "config.json") -> BertConfig:
    """Our config from HF's config.json, or Google's bert_config.json (the same keys)."""
    act = hf.get("hidden_act", "gelu")
    if act != "gelu":
        raise CheckpointError(
            f"{source} hidden_act={act!r}; this BERT has the 'gelu' activation only."
        )
    return BertConfig(
        vocab_size=hf.get("vocab_size", 30522),
        hidden_size=hf.get("hidden_size", 768),
        num_layers=hf.get("num_hidden_layers", 12),
        num_heads=hf.get("num_attention_heads", 12),
        intermediate_size=hf.get("intermediate_size", 3072),
        max_position_embeddings=hf.get("max_position_embeddings", 512),
        type_vocab_size=hf.get("type_vocab_size", 2),
        dropout_rate=hf.get("hidden_dropout_prob", 0.1),
        attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
        layer_norm_epsilon=hf.get("layer_norm_eps", 1e-12),
        initializer_range=hf.get("initializer_range", 0.02),
    )


def _bias_heads(heads: tuple[int, int]) -> TransformPair:
    return (lambda b: b.reshape(heads)), (lambda b: b.reshape(-1))


# Fine-tuning heads: our top-level module -> HF's (the same name in BertFor{Sequence,Token}
# Classification, BertForMultipleChoice ('classifier') and BertForQuestionAnswering).
FINE_TUNING_HEADS = ("classifier", "qa_outputs")


# HF builds these without the [CLS] pooler (add_pooling_layer=False); ours keeps one, unused.
NO_POOLER = ("BertForQuestionAnswering", "BertForTokenClassification")


def name_map(
    cfg: BertConfig,
    prefix: str = "bert.",
    heads_too: bool = True,
    fine_tuning_head: str | None = None,
    pooler: bool = True,
) -> Iterator[tuple[str, tuple[str, ...], tuple]]:
    """(HF name, our path, (to_ours, to_hf)) for every parameter. `prefix` is 'bert.' for
    BertForPreTraining and the fine-tuning models, '' for a bare BertModel; `heads_too` adds
    the MLM/NSP heads, `fine_tuning_head` a fine-tuning head's linear layer; `pooler=False`
    for the HF classes that have none."""
    heads = (cfg.num_heads, cfg.head_dim)
    enc = ("encoder",)
    emb = f"{prefix}embeddings"
    yield (
        f"{emb}.word_embeddings.weight",
        (*enc, "embeddings", "word_embeddings", "embedding"),
        same(),
    )
    yield f"{emb}.position_embeddings.weight", (*enc, "embeddings", "position_embeddings"), same()
    yield f"{emb}.token_type_embeddings.weight", (*enc, "embeddings", "segment_embeddings"), same()
    yield f"{emb}.LayerNorm.weight", (*enc, "embeddings", "layer_norm", "scale"), same()
    yield f"{emb}.LayerNorm.bias", (*enc, "embeddings", "layer_norm", "bias"), same()
    for i in range(cfg.num_layers):
        hf = f"{prefix}encoder.layer.{i}"
        ours = (*enc, f"layers_{i}")
        for name in ("query", "key", "value"):
            yield (
                f"{hf}.attention.self.{name}.weight",
                (*ours, "attention", name, "kernel"),
                to_heads(heads),
            )
            yield (
                f"{hf}.attention.self.{name}.bias",
                (*ours, "attention", name, "bias"),
                _bias_heads(heads),
            )
        yield (
            f"{hf}.attention.output.dense.weight",
            (*ours, "attention", "out", "kernel"),
            from_heads(heads),
        )
        yield f"{hf}.attention.output.dense.bias", (*ours, "attention", "out", "bias"), same()
        for hf_norm, norm in (
            ("attention.output.LayerNorm", "attention_norm"),
            ("output.LayerNorm", "mlp_norm"),
        ):
            yield f"{hf}.{hf_norm}.weight", (*ours, norm, "scale"), same()
            yield f"{hf}.{hf_norm}.bias", (*ours, norm, "bias"), same()
        for hf_dense, dense in (("intermediate.dense", "wi"), ("output.dense", "wo")):
            yield f"{hf}.{hf_dense}.weight", (*ours, "mlp", dense, "kernel"), transposed()
            yield f"{hf}.{hf_dense}.bias", (*ours, "mlp", dense, "bias"), same()
    if pooler:
        yield f"{prefix}pooler.dense.weight", (*enc, "pooler", "kernel"), transposed()
        yield f"{prefix}pooler.dense.bias", (*enc, "pooler", "bias"), same()
    if heads_too:
        yield "cls.predictions.transform.dense.weight", ("mlm", "transform", "kernel"), transposed()
        yield "cls.predictions.transform.dense.bias", ("mlm", "transform", "bias"), same()
        yield "cls.predictions.transform.LayerNorm.weight", ("mlm", "layer_norm", "scale"), same()
        yield "cls.predictions.transform.LayerNorm.bias", ("mlm", "layer_norm", "bias"), same()
        yield "cls.predictions.bias", ("mlm_output_bias",), same()
        yield "cls.seq_relationship.weight", ("nsp", "kernel"), transposed()
        yield "cls.seq_relationship.bias", ("nsp", "bias"), same()
    if fine_tuning_head:
        yield f"{fine_tuning_head}.weight", (fine_tuning_head, "kernel"), transposed()
        yield f"{fine_tuning_head}.bias", (fine_tuning_head, "bias"), same()


def _layout(names) -> tuple[str, bool, str | None, bool]:
    """(prefix, has pretraining heads, fine-tuning head, has pooler) of HF tensor names."""
    names = set(names)
    prefix = "bert." if any(k.startswith("bert.") for k in names) else ""
    head = next((h for h in FINE_TUNING_HEADS if f"{h}.weight" in names), None)
    return (
        prefix,
        "cls.seq_relationship.weight" in names,
        head,
        f"{prefix}pooler.dense.weight" in names,
    )


# Tensors that are copies of others (tied output layer); accepted only when equal.
_TIED = {
    "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}


def params_from_hf(tensors: dict[str, Tensor], cfg: BertConfig) -> Params:
    """Our nested parameters from HF tensors: BertForPreTraining, a bare BertModel (no heads
    in the result), or a fine-tuned BertFor{SequenceClassification, MultipleChoice,
    TokenClassification, QuestionAnswering} (its head as `classifier` / `qa_outputs`)."""
    tensors = dict(tensors)
    prefix, pretraining, head, pooler = _layout(tensors)
    for copy, source in _TIED.items():
        if copy in tensors:
            if source in tensors and not np.array_equal(tensors[copy], tensors[source]):
                raise CheckpointError(f"Tensor {copy} differs from {source}; BERT ties them.")
            del tensors[copy]
    params: Params = {}
    for hf_name, path, (to_ours, _) in name_map(
        cfg, prefix, heads_too=pretraining, fine_tuning_head=head, pooler=pooler or head is None
    ):
        if hf_name not in tensors:
            raise CheckpointError(f"Tensor {hf_name} is missing from the checkpoint.")
        node = params
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = np.asarray(to_ours(tensors.pop(hf_name)), np.float32)
    if not pooler and head is not None:  # a span or token head: the pooler is never used
        h = cfg.hidden_size
        params["encoder"]["pooler"] = {
            "kernel": np.zeros((h, h), np.float32),
            "bias": np.zeros((h,), np.float32),
        }
    tensors.pop("bert.embeddings.position_ids", None)
    tensors.pop("embeddings.position_ids", None)
    if tensors:
        raise CheckpointError(f"Unexpected tensors in the checkpoint: {sorted(tensors)[:5]}.")
    return params


def params_to_hf(
    params: Params, cfg: BertConfig, architecture: str | None = None
) -> dict[str, Tensor]:
    """HF tensors from our parameters: BertForPreTraining's (the tied copies included) for a
    pretraining model, the encoder plus the head's linear layer for a fine-tuned one (without
    the pooler for the `NO_POOLER` architectures); our parameters in either layer layout."""
    from t5x_like.checkpoints import scan_layout

    params = scan_layout.unstack_layers(params)
    out = {}
    pretraining = "mlm" in params
    head = next((h for h in FINE_TUNING_HEADS if h in params), None)
    architecture = architecture or _architecture(head)
    for hf_name, path, (_, to_hf) in name_map(
        cfg, heads_too=pretraining, fine_tuning_head=head, pooler=architecture not in NO_POOLER
    ):
        node = params
        for key in path:
            node = node[key]
        out[hf_name] = np.ascontiguousarray(to_hf(np.asarray(node, np.float32)))
    if pretraining:
        for copy, source in _TIED.items():
            out[copy] = out[source]
    return out


# ------------------------------------------------------------------------------ files
def load_hf_checkpoint(checkpoint_dir: str) -> tuple[BertConfig, Params]:
    """(config, params) from a HuggingFace BERT directory, shapes checked against the config."""
    return from_hf_tensors(read_config(checkpoint_dir), read_tensors(checkpoint_dir))


def from_hf_tensors(
    hf: dict[str, Any], tensors: dict[str, Tensor], source: str = "config.json"
) -> tuple[BertConfig, Params]:
    """(config, params) from a config in HF's keys and tensors under HF's names (a HuggingFace
    directory's, or Google's TF1 checkpoint renamed), every shape checked against the config
    (`source` names the config file in the message)."""
    cfg = config_from_hf(hf, source)
    params = params_from_hf(tensors, cfg)
    expected = expected_params(cfg)
    head = next((h for h in FINE_TUNING_HEADS if h in params), None)
    if head:  # the head's shape is the checkpoint's own (its number of labels)
        expected = {**expected, head: params[head]}
    for hf_name, path, _ in name_map(cfg, heads_too="mlm" in params, fine_tuning_head=head):
        got, want = params, expected
        for key in path:
            got, want = got[key], want[key]
        if tuple(got.shape) != tuple(want.shape):
            raise CheckpointError(
                f"Tensor {hf_name} gives shape {tuple(got.shape)} for "
                f"{'/'.join(path)}, but {source} implies "
                f"{tuple(want.shape)}."
            )
    return cfg, params


def expected_params(cfg: BertConfig) -> Params:
    """ShapeDtypeStructs of BertForPreTraining's parameters (nothing allocated)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from t5x_like.families.bert.network import BertForPreTraining

    return nn.meta.unbox(
        jax.eval_shape(
            lambda: BertForPreTraining(cfg).init(jax.random.key(0), jnp.ones((1, 8), jnp.int32))
        )["params"]
    )


# The HF architecture of each fine-tuning head (our module name, number of outputs).
HEAD_ARCHITECTURES = {
    "qa_outputs": "BertForQuestionAnswering",
    "classifier": "BertForSequenceClassification",
}


def _architecture(head: str | None) -> str:
    return HEAD_ARCHITECTURES[head] if head else "BertForPreTraining"


def hf_config(
    cfg: BertConfig, architecture: str = "BertForPreTraining", num_labels: int | None = None
) -> dict[str, Any]:
    extra = {"num_labels": num_labels} if num_labels else {}
    return {
        "architectures": [architecture],
        "model_type": "bert",
        **extra,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.intermediate_size,
        "hidden_act": "gelu",
        "hidden_dropout_prob": cfg.dropout_rate,
        "attention_probs_dropout_prob": cfg.attention_dropout_rate,
        "max_position_embeddings": cfg.max_position_embeddings,
        "type_vocab_size": cfg.type_vocab_size,
        "initializer_range": cfg.initializer_range,
        "layer_norm_eps": cfg.layer_norm_epsilon,
        "pad_token_id": 0,
    }


def export_architecture(params: Params, architecture: str | None = None) -> str:
    """The HF class an export writes: BertForPreTraining, or the fine-tuned model's
    (`architecture` overrides the guess from the head, e.g. 'BertForMultipleChoice' or
    'BertForTokenClassification' for a `classifier` head)."""
    return architecture or _architecture(next((h for h in FINE_TUNING_HEADS if h in params), None))


def save_hf_checkpoint(
    directory: str, params: Params, cfg: BertConfig, architecture: str | None = None
) -> str:
    """Write config.json + model.safetensors in HuggingFace's layout for
    `export_architecture(params, architecture)`; returns the architecture written."""
    import json
    import os

    from safetensors.numpy import save_file

    head = next((h for h in FINE_TUNING_HEADS if h in params), None)
    architecture = export_architecture(params, architecture)
    num_labels = None
    if head == "classifier" and architecture != "BertForMultipleChoice":
        num_labels = int(np.shape(params[head]["bias"])[0])
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(hf_config(cfg, architecture, num_labels), f, indent=2)
    tensors = params_to_hf(params, cfg, architecture)
    # safetensors refuses shared memory; the tied copies are written as their own arrays.
    save_file(
        {k: np.array(v, copy=True) for k, v in tensors.items()},
        os.path.join(directory, "model.safetensors"),
        metadata={"format": "pt"},
    )
    return architecture


# ------------------------------------------------------------------------- registration
# ------------------------------------------------------------------------------ reference
def load_hf_bert(checkpoint_dir: str, has_heads: bool):
    """transformers' BertForPreTraining (or BertModel for a checkpoint without heads)."""
    hf_files.require_torch()
    import transformers

    cls = transformers.BertForPreTraining if has_heads else transformers.BertModel
    return cls.from_pretrained(checkpoint_dir, local_files_only=True).float().eval()


def max_abs_bert_differences(
    hf_model: Any, config: Any, params: Any, seed: int = 0
) -> dict[str, float]:
    """Largest |ours - reference| of the MLM logits (real positions) and NSP logits, or of the
    sequence output and pooled [CLS] for a checkpoint without heads."""
    import torch

    rng = np.random.default_rng(seed)
    ids = rng.integers(1, config.vocab_size, (2, 12))
    ids[0, -3:] = 0
    segments = np.zeros_like(ids)
    segments[:, 6:] = 1
    mask = (ids != 0).astype(np.int64)
    with torch.no_grad():
        ref = hf_model(
            input_ids=torch.tensor(ids),
            token_type_ids=torch.tensor(segments),
            attention_mask=torch.tensor(mask),
        )
    real = mask.astype(bool)
    if "mlm" in params:
        out = bert.BertForPreTraining(config).apply(
            {"params": params}, jnp.asarray(ids), jnp.asarray(segments), jnp.asarray(mask)
        )
        return {
            "logit": float(
                np.max(
                    np.abs(
                        np.asarray(out["mlm_logits"])[real] - ref.prediction_logits.numpy()[real]
                    )
                )
            ),
            "nsp": float(
                np.max(np.abs(np.asarray(out["nsp_logits"]) - ref.seq_relationship_logits.numpy()))
            ),
        }
    sequence, pooled = bert.BertEncoder(config).apply(
        {"params": params["encoder"]}, jnp.asarray(ids), jnp.asarray(segments), jnp.asarray(mask)
    )
    return {
        "logit": float(
            np.max(np.abs(np.asarray(sequence)[real] - ref.last_hidden_state.numpy()[real]))
        ),
        "pooled": float(np.max(np.abs(np.asarray(pooled) - ref.pooler_output.numpy()))),
    }


def verify(checkpoint_dir: str, cfg: BertConfig, params: Params) -> dict[str, float]:
    """Our model and transformers' (with the pretraining heads when the checkpoint has them)
    on the same batch: the largest differences."""
    model = load_hf_bert(checkpoint_dir, has_heads="mlm" in params)
    return max_abs_bert_differences(model, cfg, params)


def export(
    directory: str, params: Params, cfg: BertConfig, architecture: str | None = None
) -> tuple[Callable[[], object], str]:
    architecture = export_architecture(params, architecture)
    return lambda: save_hf_checkpoint(directory, params, cfg, architecture), architecture


def tokenizer(directory: str, model_type: str) -> tuple[dict[str, str], dict[str, Any]] | None:
    """BertTokenizer's vocab.txt, lower-casing as its tokenizer_config.json says (default on)."""
    files = hf_files.present(directory, "vocab.txt")
    if files is None:
        return None
    lower_case = bool(hf_files.tokenizer_config(directory).get("do_lower_case", True))
    return files, {"type": "wordpiece", "file": "vocab.txt", "lower_case": lower_case}


HUGGINGFACE = hf_families.register(
    hf_families.HuggingFaceFamily(
        ("bert",), BertConfig, load_hf_checkpoint, verify, export, tokenizer
    )
)
