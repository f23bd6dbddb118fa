"""HuggingFace OpenAI GPT (`OpenAIGPTLMHeadModel`) and GPT-2 (`GPT2LMHeadModel`) tensors <->
our decoder-only parameters.

Both store projections as `Conv1D` weights laid out (in, out), our kernels' layout; the fused
`c_attn` (in, 3 * hidden) splits into query, key and value (in, heads, head_dim). The output
layer is tied to the token embedding (`lm_head.weight` is accepted only as that copy).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from t5x_like.checkpoints import hf_families, hf_files
from t5x_like.checkpoints.hf_files import read_config, read_tensors
from t5x_like.errors import CheckpointError
from t5x_like.families.gpt.network import DecoderOnly, GPTConfig

Tensor = np.ndarray
Params = dict[str, Any]

# HF activation names -> ours, per model type. The same name means different functions: in
# GPT-2's table (ACT2FN) 'gelu' is the exact erf GELU, while OpenAI GPT's own table (ACT_FNS in
# modeling_openai.py) maps 'gelu' to the tanh approximation, the GELU of OpenAI's released
# train.py. Ours: 'gelu' is the tanh approximation, 'gelu_exact' the erf one.
_ACTIVATIONS = {
    "gpt2": {"gelu": "gelu_exact", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "relu": "relu"},
    "openai-gpt": {"gelu": "gelu", "relu": "relu"},
}
# Per family: (model_type, embeddings, layer norms in block order, final norm or None)
_LAYOUTS = {
    "openai-gpt": ("transformer.tokens_embed", "transformer.positions_embed", None),
    "gpt2": ("transformer.wte", "transformer.wpe", "transformer.ln_f"),
}


def config_from_hf(hf: dict[str, Any]) -> GPTConfig:
    model_type = hf.get("model_type", "gpt2")
    act_key = "afn" if model_type == "openai-gpt" else "activation_function"
    act = hf.get(act_key, "gelu" if model_type == "openai-gpt" else "gelu_new")
    activations = _ACTIVATIONS["openai-gpt" if model_type == "openai-gpt" else "gpt2"]
    if act not in activations:
        raise CheckpointError(f"config.json {act_key}={act!r}; supported: {sorted(activations)}.")
    hidden = hf.get("n_embd", 768)
    return GPTConfig(
        vocab_size=hf.get("vocab_size", 40478),
        max_position_embeddings=hf.get("n_positions", 512),
        hidden_size=hidden,
        num_layers=hf.get("n_layer", 12),
        num_heads=hf.get("n_head", 12),
        intermediate_size=hf.get("n_inner") or 4 * hidden,
        dropout_rate=hf.get("resid_pdrop", 0.1),
        attention_dropout_rate=hf.get("attn_pdrop", 0.1),
        layer_norm_epsilon=hf.get("layer_norm_epsilon", 1e-5),
        initializer_range=hf.get("initializer_range", 0.02),
        pre_layer_norm=model_type == "gpt2",
        activation=activations[act],
        scale_residual_init=model_type == "gpt2",
    )


# Layer options that transformers' GPT classes cannot express (the T5-paper language model).
_HF_LAYOUT = {
    "norm": "layer_norm",
    "use_bias": True,
    "position_encoding": "learned",
    "initialization": "normal",
    "tie_embeddings": True,
    "num_special_tokens": 0,
}


def hf_config(cfg: GPTConfig) -> dict[str, Any]:
    """config.json for transformers: GPT-2 for a pre-LN model, OpenAI GPT otherwise."""
    different = {k: getattr(cfg, k) for k, v in _HF_LAYOUT.items() if getattr(cfg, k) != v}
    if different:
        raise CheckpointError(
            f"transformers' GPT models have no equivalent of {different}; "
            "only GPT-1/GPT-2-style models export (T5-style language models "
            "stay in this codebase's checkpoint format)."
        )
    names = {
        ours: theirs
        for theirs, ours in _ACTIVATIONS[_family(cfg)].items()
        if theirs != "gelu_pytorch_tanh"
    }
    if cfg.activation not in names:
        raise CheckpointError(
            f"activation={cfg.activation!r} has no name in transformers' "
            f"{_family(cfg)} models (they offer {sorted(names)}); OpenAI GPT's 'gelu' is the "
            "tanh approximation, our 'gelu'."
        )
    act = names[cfg.activation]
    common = {
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.max_position_embeddings,
        "n_embd": cfg.hidden_size,
        "n_layer": cfg.num_layers,
        "n_head": cfg.num_heads,
        "resid_pdrop": cfg.dropout_rate,
        "embd_pdrop": cfg.dropout_rate,
        "attn_pdrop": cfg.attention_dropout_rate,
        "layer_norm_epsilon": cfg.layer_norm_epsilon,
        "initializer_range": cfg.initializer_range,
    }
    if cfg.pre_layer_norm:
        return {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "activation_function": act,
            "n_inner": cfg.intermediate_size,
            **common,
        }
    if cfg.intermediate_size != 4 * cfg.hidden_size:
        raise CheckpointError("OpenAI GPT's layout has a 4 x hidden feed-forward layer only.")
    return {
        "architectures": ["OpenAIGPTLMHeadModel"],
        "model_type": "openai-gpt",
        "afn": act,
        **common,
    }


def _family(cfg: GPTConfig) -> str:
    return "gpt2" if cfg.pre_layer_norm else "openai-gpt"


def params_from_hf(tensors: dict[str, Tensor], cfg: GPTConfig) -> Params:
    """Our nested parameters from a GPT / GPT-2 LM-head checkpoint's tensors."""
    tensors = dict(tensors)
    words, positions, final = _LAYOUTS[_family(cfg)]
    heads, head_dim, hidden = cfg.num_heads, cfg.head_dim, cfg.hidden_size

    def take(name: str) -> Tensor:
        if name not in tensors:
            raise CheckpointError(f"Tensor {name} is missing from the checkpoint.")
        return np.asarray(tensors.pop(name), np.float32)

    params: Params = {
        "token_embeddings": {"embedding": take(f"{words}.weight")},
        "position_embeddings": take(f"{positions}.weight"),
    }
    if "lm_head.weight" in tensors:
        if not np.array_equal(tensors["lm_head.weight"], params["token_embeddings"]["embedding"]):
            raise CheckpointError("lm_head.weight differs from the token embedding; GPT ties them.")
        del tensors["lm_head.weight"]
    norms = ("ln_1", "ln_2")  # before (pre-LN) or after (post-LN) attention, then the MLP
    for i in range(cfg.num_layers):
        hf = f"transformer.h.{i}"
        qkv_w, qkv_b = take(f"{hf}.attn.c_attn.weight"), take(f"{hf}.attn.c_attn.bias")
        attention = {}
        for j, name in enumerate(("query", "key", "value")):
            attention[name] = {
                "kernel": qkv_w[:, j * hidden : (j + 1) * hidden].reshape(hidden, heads, head_dim),
                "bias": qkv_b[j * hidden : (j + 1) * hidden].reshape(heads, head_dim),
            }
        attention["out"] = {
            "kernel": take(f"{hf}.attn.c_proj.weight").reshape(heads, head_dim, hidden),
            "bias": take(f"{hf}.attn.c_proj.bias"),
        }
        layer: dict[str, Any] = {
            "attention": attention,
            "mlp": {
                "wi": {
                    "kernel": take(f"{hf}.mlp.c_fc.weight"),
                    "bias": take(f"{hf}.mlp.c_fc.bias"),
                },
                "wo": {
                    "kernel": take(f"{hf}.mlp.c_proj.weight"),
                    "bias": take(f"{hf}.mlp.c_proj.bias"),
                },
            },
        }
        for hf_norm, ours in zip(norms, ("attention_norm", "mlp_norm")):
            layer[ours] = {
                "scale": take(f"{hf}.{hf_norm}.weight"),
                "bias": take(f"{hf}.{hf_norm}.bias"),
            }
        params[f"layers_{i}"] = layer
    if final:
        params["final_norm"] = {"scale": take(f"{final}.weight"), "bias": take(f"{final}.bias")}
    leftover = [k for k in tensors if not k.endswith((".attn.bias", ".attn.masked_bias"))]
    if leftover:
        raise CheckpointError(f"Unexpected tensors in the checkpoint: {sorted(leftover)[:5]}.")
    return params


def params_to_hf(params: Params, cfg: GPTConfig) -> dict[str, Tensor]:
    """The LM-head model's tensors (lm_head.weight included, as the tied copy); our
    parameters in either layer layout."""
    from t5x_like.checkpoints import scan_layout

    params = scan_layout.unstack_layers(params)
    words, positions, final = _LAYOUTS[_family(cfg)]
    hidden = cfg.hidden_size
    out = {
        f"{words}.weight": params["token_embeddings"]["embedding"],
        f"{positions}.weight": params["position_embeddings"],
    }
    for i in range(cfg.num_layers):
        hf, layer = f"transformer.h.{i}", params[f"layers_{i}"]
        attention = layer["attention"]
        out[f"{hf}.attn.c_attn.weight"] = np.concatenate(
            [
                np.asarray(attention[n]["kernel"]).reshape(hidden, hidden)
                for n in ("query", "key", "value")
            ],
            axis=1,
        )
        out[f"{hf}.attn.c_attn.bias"] = np.concatenate(
            [np.asarray(attention[n]["bias"]).reshape(-1) for n in ("query", "key", "value")]
        )
        out[f"{hf}.attn.c_proj.weight"] = np.asarray(attention["out"]["kernel"]).reshape(
            hidden, hidden
        )
        out[f"{hf}.attn.c_proj.bias"] = attention["out"]["bias"]
        out[f"{hf}.mlp.c_fc.weight"] = layer["mlp"]["wi"]["kernel"]
        out[f"{hf}.mlp.c_fc.bias"] = layer["mlp"]["wi"]["bias"]
        out[f"{hf}.mlp.c_proj.weight"] = layer["mlp"]["wo"]["kernel"]
        out[f"{hf}.mlp.c_proj.bias"] = layer["mlp"]["wo"]["bias"]
        for hf_norm, ours in zip(("ln_1", "ln_2"), ("attention_norm", "mlp_norm")):
            out[f"{hf}.{hf_norm}.weight"] = layer[ours]["scale"]
            out[f"{hf}.{hf_norm}.bias"] = layer[ours]["bias"]
    if final:
        out[f"{final}.weight"] = params["final_norm"]["scale"]
        out[f"{final}.bias"] = params["final_norm"]["bias"]
    out["lm_head.weight"] = out[f"{words}.weight"]
    return {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in out.items()}


def expected_params(cfg: GPTConfig) -> Params:
    """ShapeDtypeStructs of the decoder-only model's parameters (nothing allocated)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from t5x_like.families.gpt.network import DecoderOnly

    return nn.meta.unbox(
        jax.eval_shape(
            lambda: DecoderOnly(cfg).init(jax.random.key(0), jnp.ones((1, 8), jnp.int32))
        )["params"]
    )


def load_hf_checkpoint(checkpoint_dir: str) -> tuple[GPTConfig, Params]:
    """(config, params) from a HuggingFace GPT or GPT-2 directory (safetensors), every shape
    checked against what config.json implies."""
    from flax import traverse_util

    cfg = config_from_hf(read_config(checkpoint_dir))
    params = params_from_hf(read_tensors(checkpoint_dir), cfg)
    got = traverse_util.flatten_dict(params, sep="/")
    for name, want in traverse_util.flatten_dict(expected_params(cfg), sep="/").items():
        if tuple(got[name].shape) != tuple(want.shape):
            raise CheckpointError(
                f"{name} has shape {tuple(got[name].shape)}, but config.json "
                f"implies {tuple(want.shape)}."
            )
    return cfg, params


def save_hf_checkpoint(directory: str, params: Params, cfg: GPTConfig) -> None:
    """config.json + model.safetensors that transformers loads as the LM-head model."""
    import json
    import os

    from safetensors.numpy import save_file

    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(hf_config(cfg), f, indent=2)
    tensors = params_to_hf(params, cfg)
    save_file(
        {k: np.array(v, copy=True) for k, v in tensors.items()},
        os.path.join(directory, "model.safetensors"),
        metadata={"format": "pt"},
    )


# ------------------------------------------------------------------------- registration
# ------------------------------------------------------------------------------ reference
def max_abs_gpt_differences(
    checkpoint_dir: str, config: Any, params: Any, seed: int = 0
) -> dict[str, float]:
    """Largest |ours - reference| of the next-token logits of transformers' OpenAI GPT / GPT-2
    LM-head model on a random batch."""
    hf_files.require_torch()
    import torch
    import transformers

    model = (
        transformers.AutoModelForCausalLM.from_pretrained(checkpoint_dir, local_files_only=True)
        .float()
        .eval()
    )
    ids = np.random.default_rng(seed).integers(0, config.vocab_size, (2, 12))
    with torch.no_grad():
        ref = model(torch.tensor(ids)).logits.numpy()
    ours = DecoderOnly(config).apply({"params": params}, ids)
    return {"logit": float(np.max(np.abs(np.asarray(ours) - ref)))}


def verify(checkpoint_dir: str, cfg: GPTConfig, params: Params) -> dict[str, float]:
    """Our model and transformers' on the same batch: the largest differences."""
    return max_abs_gpt_differences(checkpoint_dir, cfg, params)


def export(
    directory: str, params: Params, cfg: GPTConfig, architecture: str | None = None
) -> tuple[Callable[[], object], str]:
    del architecture  # the LM-head model of the config's kind (OpenAI GPT or GPT-2)
    return lambda: save_hf_checkpoint(directory, params, cfg), hf_config(cfg)["architectures"][0]


def tokenizer(directory: str, model_type: str) -> tuple[dict[str, str], dict[str, Any]] | None:
    """GPT-2's byte-level or OpenAI GPT's BPE: vocab.json + merges.txt."""
    files = hf_files.present(directory, "vocab.json", "merges.txt")
    if files is None:
        return None
    kind = "gpt1_bpe" if model_type == "openai-gpt" else "gpt2_bpe"
    return files, {"type": kind, "vocab": "vocab.json", "merges": "merges.txt"}


HUGGINGFACE = hf_families.register(
    hf_families.HuggingFaceFamily(
        ("openai-gpt", "gpt2"), GPTConfig, load_hf_checkpoint, verify, export, tokenizer
    )
)
