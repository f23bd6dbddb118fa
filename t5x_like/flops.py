"""Model FLOPs of one example's forward pass, counted by hand from the config.

What counts (the convention MFU uses): every matrix multiply, i.e. the dense projections, the
attention scores (QK^T) and their weighted sum (AV) over the full score matrix, and the output
projection onto the vocabulary; 2 FLOPs per multiply-add. Embedding lookups, norms, softmax
and activations are not counted. A training step costs about 3x the forward pass (backward =
2x), times the batch.

This is the T5 paper's "M" (Table 2): an L+L encoder-decoder and an L-layer decoder-only model
over the concatenated (inputs, targets) cost about the same, and the L/2+L/2 model half. Each
family's config adds up these parts for its own architecture (`forward_flops`).
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


def forward_flops(config: Any, feature_lengths: Mapping[str, int]) -> int | None:
    """Forward FLOPs of one example at the task's feature lengths, as the config's family
    counts them (`ModelConfig.forward_flops`; None for a family that does not)."""
    return config.forward_flops(feature_lengths)


def train_step_flops(
    config: Any, feature_lengths: Mapping[str, int], batch_size: int
) -> float | None:
    """Hand-counted model FLOPs of one training step (forward x 3, whole batch). Unlike XLA's
    cost analysis, which counts a loop body once, this does not depend on how the step is
    compiled (scanned layers, a chunked loss)."""
    forward = forward_flops(config, feature_lengths)
    return None if forward is None else forward * TRAINING_MULTIPLIER * batch_size
