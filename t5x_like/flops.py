"""Model FLOPs of one example's forward pass, counted by hand from the config.

What counts (the convention MFU uses): every matrix multiply, i.e. the dense projections, the
attention scores (QK^T) and their weighted sum (AV) over the full score matrix, and the output
projection onto the vocabulary; 2 FLOPs per multiply-add. Embedding lookups, norms, softmax
and activations are not counted. A training step costs about 3x the forward pass (backward =
2x), times the batch.

This is the T5 paper's "M" (Table 2): an L+L encoder-decoder and an L-layer decoder-only model
over the concatenated (inputs, targets) cost about the same, and the L/2+L/2 model half.
"""

from __future__ import annotations

from typing import Any, Mapping

TRAINING_MULTIPLIER = 3


def attention_flops(
    query_tokens: int, key_tokens: int, width: int, heads: int, head_dim: int
) -> int:
    """Query and output projections over the queries, key and value projections over the
    keys, and the two score products."""
    inner = heads * head_dim
    projections = 2 * width * inner * (2 * query_tokens + 2 * key_tokens)
    scores = 2 * 2 * query_tokens * key_tokens * inner
    return projections + scores


def mlp_flops(tokens: int, width: int, hidden: int, input_projections: int = 1) -> int:
    """`input_projections` is 2 for a gated feed-forward (GEGLU's wi_0 and wi_1)."""
    return 2 * tokens * width * hidden * (input_projections + 1)


def encoder_decoder_flops(cfg: Any, inputs: int, targets: int) -> int:
    """T5 (`T5Config`): the encoder over the inputs, the decoder over the targets (self- and
    cross-attention), the vocabulary projection over the targets. Shared parameters do not
    change the count: the stack still runs twice."""
    projections = len(cfg.mlp_activations)
    encoder_layer = attention_flops(
        inputs, inputs, cfg.emb_dim, cfg.num_heads, cfg.head_dim
    ) + mlp_flops(inputs, cfg.emb_dim, cfg.mlp_dim, projections)
    decoder_layer = (
        attention_flops(targets, targets, cfg.emb_dim, cfg.num_heads, cfg.head_dim)
        + attention_flops(targets, inputs, cfg.emb_dim, cfg.num_heads, cfg.head_dim)
        + mlp_flops(targets, cfg.emb_dim, cfg.mlp_dim, projections)
    )
    logits = 2 * targets * cfg.emb_dim * cfg.vocab_size
    return cfg.num_encoder_layers * encoder_layer + cfg.num_decoder_layers * decoder_layer + logits


def decoder_only_flops(cfg: Any, length: int) -> int:
    """A decoder-only model (`GPTConfig`) over one row of `length` tokens (inputs and targets
    concatenated), logits at every position."""
    layer = attention_flops(
        length, length, cfg.hidden_size, cfg.num_heads, cfg.head_dim
    ) + mlp_flops(length, cfg.hidden_size, cfg.intermediate_size, len(cfg.activations))
    return cfg.num_layers * layer + 2 * length * cfg.hidden_size * cfg.vocab_size


def encoder_only_flops(cfg: Any, length: int, predictions: int) -> int:
    """BERT (`BertConfig`) over `length` tokens, the masked-LM head (a dense transform and the
    vocabulary projection) at `predictions` positions and the pooler."""
    layer = attention_flops(
        length, length, cfg.hidden_size, cfg.num_heads, cfg.head_dim
    ) + mlp_flops(length, cfg.hidden_size, cfg.intermediate_size)
    head = 2 * predictions * cfg.hidden_size * (cfg.hidden_size + cfg.vocab_size)
    return cfg.num_layers * layer + head + 2 * cfg.hidden_size * cfg.hidden_size


def forward_flops(config: Any, feature_lengths: Mapping[str, int]) -> int | None:
    """Forward FLOPs of one example at the task's feature lengths, for any family's config
    (None for an unknown one)."""
    inputs = int(feature_lengths.get("inputs", 0))
    targets = int(feature_lengths.get("targets", 0))
    family = getattr(config, "FAMILY", "t5")
    if family == "t5" and hasattr(config, "num_encoder_layers"):
        return encoder_decoder_flops(config, inputs, targets)
    if family == "gpt":
        return decoder_only_flops(config, inputs + targets)
    if family == "bert":
        return encoder_only_flops(config, inputs, targets)
    return None


def train_step_flops(
    config: Any, feature_lengths: Mapping[str, int], batch_size: int
) -> float | None:
    """Hand-counted model FLOPs of one training step (forward x 3, whole batch). Unlike XLA's
    cost analysis, which counts a loop body once, this does not depend on how the step is
    compiled (scanned layers, a chunked loss)."""
    forward = forward_flops(config, feature_lengths)
    return None if forward is None else forward * TRAINING_MULTIPLIER * batch_size
