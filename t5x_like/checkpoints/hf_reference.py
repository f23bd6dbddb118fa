"""Run the HuggingFace PyTorch T5 beside ours on one batch and report the largest differences.

Needs the `test` extra (torch + transformers); they are reference implementations, not runtime
dependencies.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from t5x_like.families.t5.model import EncoderDecoderModel
from t5x_like.families.t5.network import T5Config, Transformer

VERIFY_TOLERANCE = 1e-4


def _require_torch():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise SystemExit(
            "--verify needs torch and transformers, the reference implementation: "
            "pip install -e '.[test]' (or pip install torch==2.13.0 transformers)."
        ) from e


def load_hf_model(checkpoint_dir: str):
    """transformers' own T5ForConditionalGeneration, read from local files only."""
    _require_torch()
    from transformers import T5ForConditionalGeneration

    model = T5ForConditionalGeneration.from_pretrained(
        checkpoint_dir, local_files_only=True, use_safetensors=True
    )
    return model.float().eval()


def example_batch(
    vocab_size: int, batch_size: int = 2, input_len: int = 12, target_len: int = 9, seed: int = 0
) -> dict[str, np.ndarray]:
    """Random tokens (ids 2..vocab-1) with trailing padding on the encoder side of row 0."""
    rng = np.random.default_rng(seed)
    inputs = rng.integers(2, vocab_size, (batch_size, input_len)).astype(np.int32)
    inputs[0, input_len - 3 :] = 0
    targets = rng.integers(2, vocab_size, (batch_size, target_len)).astype(np.int32)
    decoder_inputs = np.concatenate([np.zeros((batch_size, 1), np.int32), targets[:, :-1]], axis=1)
    return {
        "encoder_input_tokens": inputs,
        "decoder_input_tokens": decoder_inputs,
        "decoder_target_tokens": targets,
    }


def max_abs_differences(
    hf_model: Any, config: T5Config, params: Any, batch: dict[str, np.ndarray]
) -> dict[str, float]:
    """Largest |ours - reference| of the encoder output (real positions) and decoder logits."""
    import torch

    inputs = batch["encoder_input_tokens"]
    attention_mask = (inputs > 0).astype(np.int64)
    with torch.no_grad():
        out = hf_model(
            input_ids=torch.tensor(inputs, dtype=torch.long),
            attention_mask=torch.tensor(attention_mask),
            decoder_input_ids=torch.tensor(batch["decoder_input_tokens"], dtype=torch.long),
        )
    ref_encoded = out.encoder_last_hidden_state.numpy()
    ref_logits = out.logits.numpy()

    model = EncoderDecoderModel(config)
    encoded = np.asarray(
        model.module.apply({"params": params}, jnp.asarray(inputs), method=Transformer.encode)
    )
    logits = np.asarray(model.logits(params, {k: jnp.asarray(v) for k, v in batch.items()}))
    real = attention_mask.astype(bool)
    return {
        "encoder": float(np.max(np.abs(encoded[real] - ref_encoded[real]))),
        "logit": float(np.max(np.abs(logits - ref_logits))),
    }


# ------------------------------------------------------------------------------ BERT
def load_hf_bert(checkpoint_dir: str, has_heads: bool):
    """transformers' BertForPreTraining (or BertModel for a checkpoint without heads)."""
    _require_torch()
    import transformers

    cls = transformers.BertForPreTraining if has_heads else transformers.BertModel
    return cls.from_pretrained(checkpoint_dir, local_files_only=True).float().eval()


def max_abs_bert_differences(
    hf_model: Any, config: Any, params: Any, seed: int = 0
) -> dict[str, float]:
    """Largest |ours - reference| of the MLM logits (real positions) and NSP logits, or of the
    sequence output and pooled [CLS] for a checkpoint without heads."""
    import torch

    from t5x_like.families.bert import network as bert

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


def max_abs_gpt_differences(
    checkpoint_dir: str, config: Any, params: Any, seed: int = 0
) -> dict[str, float]:
    """Largest |ours - reference| of the next-token logits of transformers' OpenAI GPT / GPT-2
    LM-head model on a random batch."""
    _require_torch()
    import torch
    import transformers

    from t5x_like.families.gpt import model as decoder_only

    model = (
        transformers.AutoModelForCausalLM.from_pretrained(checkpoint_dir, local_files_only=True)
        .float()
        .eval()
    )
    ids = np.random.default_rng(seed).integers(0, config.vocab_size, (2, 12))
    with torch.no_grad():
        ref = model(torch.tensor(ids)).logits.numpy()
    ours = decoder_only.DecoderOnly(config).apply({"params": params}, ids)
    return {"logit": float(np.max(np.abs(np.asarray(ours) - ref)))}
