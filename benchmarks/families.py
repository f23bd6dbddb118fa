"""The three model families as the benchmarks see them: a standard benchmark config each, the
model object the trainer steps, a synthetic batch of the model's own features, and the
feature lengths that `t5x_like.flops` counts.

The standard configs share one width (256 wide, 4 heads of 64, feed-forward 1024, vocabulary
32128, float32, no dropout) so families compare on equal terms: T5 has 4+4 layers (T5.1.1
style: gated GELU, untied output), the decoder-only model 8 pre-LN layers (GPT-2 style, the
same layer count as the encoder-decoder) over inputs+targets, BERT 4 layers with `targets`
masked predictions per sequence.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from t5x_like import optimizers
from t5x_like.families.bert import hf as hf_bert
from t5x_like.families.bert.network import BertConfig
from t5x_like.families.gpt import hf as hf_gpt
from t5x_like.families.gpt.network import GPTConfig
from t5x_like.families.t5 import hf as hf_t5
from t5x_like.families.t5.network import T5Config


@dataclasses.dataclass(frozen=True)
class Family:
    config_class: type
    benchmark_config: Any
    make_model: Callable[[Any, int | None], Any]  # (config, loss_chunk_length) -> model
    make_batch: Callable[[Any, int, int, int], dict[str, np.ndarray]]
    # (inputs, targets) -> the feature lengths `flops.train_step_flops` reads
    feature_lengths: Callable[[int, int], dict[str, int]]
    # tokens the model reads per example, for tokens/s
    tokens_per_example: Callable[[int, int], int]
    # config.json of the HuggingFace model with the config's dimensions (the converters'
    # mapping): the reference `train_throughput --compare-hf` times
    hf_config: Callable[[Any], dict[str, Any]]
    # the paper's optimizer (`optimizers.make_optimizer` name): Adafactor for T5, Adam for BERT
    # and GPT
    optimizer: str = "adafactor"

    def make_optimizer(self) -> tuple[Any, Any]:
        """(learning-rate schedule, optimizer) of the family's recipe, gin defaults."""
        lr = (
            optimizers.inverse_sqrt_schedule()
            if self.optimizer == "adafactor"
            else optimizers.bert_learning_rate()
        )
        return lr, optimizers.make_optimizer(self.optimizer, lr)


def _ids(rng: np.random.Generator, vocab_size: int, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(2, vocab_size, shape).astype(np.int32)


def t5_batch(cfg: T5Config, batch: int, inputs: int, targets: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    tgt = _ids(rng, cfg.vocab_size, (batch, targets))
    return {
        "encoder_input_tokens": _ids(rng, cfg.vocab_size, (batch, inputs)),
        "decoder_target_tokens": tgt,
        "decoder_input_tokens": np.concatenate(
            [np.zeros((batch, 1), np.int32), tgt[:, :-1]], axis=1
        ),
        "decoder_loss_weights": np.ones((batch, targets), np.float32),
    }


def decoder_only_batch(
    cfg: GPTConfig, batch: int, inputs: int, targets: int
) -> dict[str, np.ndarray]:
    """One unpacked row of inputs+targets per example, loss on every position."""
    length = inputs + targets
    rng = np.random.default_rng(0)
    tgt = _ids(rng, cfg.vocab_size, (batch, length))
    return {
        "decoder_target_tokens": tgt,
        "decoder_input_tokens": np.concatenate(
            [np.zeros((batch, 1), np.int32), tgt[:, :-1]], axis=1
        ),
        "decoder_loss_weights": np.ones((batch, length), np.float32),
    }


def bert_batch(cfg: BertConfig, batch: int, inputs: int, targets: int) -> dict[str, np.ndarray]:
    """Sentence pairs of `inputs` tokens with `targets` masked positions each."""
    rng = np.random.default_rng(0)
    positions = np.sort(
        np.stack([rng.choice(np.arange(1, inputs), targets, replace=False) for _ in range(batch)]),
        axis=1,
    ).astype(np.int32)
    return {
        "input_ids": _ids(rng, cfg.vocab_size, (batch, inputs)),
        "segment_ids": (np.arange(inputs) >= inputs // 2).astype(np.int32)[None].repeat(batch, 0),
        "input_mask": np.ones((batch, inputs), np.int32),
        "masked_lm_positions": positions,
        "masked_lm_ids": _ids(rng, cfg.vocab_size, (batch, targets)),
        "masked_lm_weights": np.ones((batch, targets), np.float32),
        "next_sentence_labels": rng.integers(0, 2, (batch,)).astype(np.int32),
    }


def _t5_model(cfg: T5Config, loss_chunk_length: int | None):
    from t5x_like.families.t5.model import EncoderDecoderModel

    return EncoderDecoderModel(cfg, loss_chunk_length=loss_chunk_length)


def _decoder_only_model(cfg: GPTConfig, loss_chunk_length: int | None):
    from t5x_like.families.gpt.model import DecoderOnlyModel

    return DecoderOnlyModel(
        cfg, attention="causal", loss_on_targets_only=False, loss_chunk_length=loss_chunk_length
    )


def _bert_model(cfg: BertConfig, loss_chunk_length: int | None):
    from t5x_like.families.bert.model import BertPretrainingModel

    if loss_chunk_length:
        raise ValueError("BERT predicts only the masked positions; it has no chunked loss.")
    return BertPretrainingModel(cfg)


FAMILIES: dict[str, Family] = {
    "t5": Family(
        T5Config,
        T5Config(
            vocab_size=32128,
            emb_dim=256,
            num_heads=4,
            head_dim=64,
            mlp_dim=1024,
            num_encoder_layers=4,
            num_decoder_layers=4,
            mlp_activations=("gelu", "linear"),
            dropout_rate=0.0,
            logits_via_embedding=False,
        ),
        _t5_model,
        t5_batch,
        lambda inputs, targets: {"inputs": inputs, "targets": targets},
        lambda inputs, targets: inputs + targets,
        hf_t5.hf_config,
    ),
    "decoder_only": Family(
        GPTConfig,
        GPTConfig(
            vocab_size=32128,
            max_position_embeddings=2048,
            hidden_size=256,
            num_layers=8,
            num_heads=4,
            intermediate_size=1024,
            dropout_rate=0.0,
            attention_dropout_rate=0.0,
            pre_layer_norm=True,
            activation="gelu",
        ),
        _decoder_only_model,
        decoder_only_batch,
        lambda inputs, targets: {"inputs": inputs, "targets": targets},
        lambda inputs, targets: inputs + targets,
        hf_gpt.hf_config,
        optimizer="adamw",
    ),
    "bert": Family(
        BertConfig,
        BertConfig(
            vocab_size=32128,
            hidden_size=256,
            num_layers=4,
            num_heads=4,
            intermediate_size=1024,
            max_position_embeddings=512,
            dropout_rate=0.0,
            attention_dropout_rate=0.0,
        ),
        _bert_model,
        bert_batch,
        lambda inputs, targets: {"inputs": inputs, "targets": targets},
        lambda inputs, targets: inputs,
        hf_bert.hf_config,
        optimizer="adamw",
    ),
}
