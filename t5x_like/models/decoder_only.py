"""Decoder-only Transformer language models: GPT-1 (Radford et al., 2018; SPEC.md section 3)
and GPT-2-style pre-LayerNorm, built from the same layers as T5 and BERT.

GPT-1: learned absolute positions, post-LN blocks with biases, GELU, output layer tied to the
token embedding, N(0, 0.02) initialisation, explicit 1/sqrt(d_head) attention scaling.
`pre_layer_norm=True` is GPT-2's arrangement (LayerNorm before each sub-block and once more
after the last). Attention is causal; with `causal_attention` (1 on a packed row's input
prefix, seqio's `decoder_causal_attention`) it is the prefix LM of the T5 paper: fully visible
over the prefix, causal after it, never across packed examples.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp

from t5x_like.models import layers

Array = jax.Array


@gin.configurable
@dataclasses.dataclass(frozen=True)
class GPTConfig(layers.FamilyConfig):
    """Dimensions of a decoder-only model; defaults are GPT-1 (117M parameters, 40,478-entry
    BPE vocabulary, 512 positions)."""

    vocab_size: int = 40478
    max_position_embeddings: int = 512
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    pre_layer_norm: bool = False
    activation: str = "gelu_exact"  # 'gelu' is the tanh approximation (GPT-2's gelu_new)
    dtype: str = "float32"

    ARCHITECTURE_FIELDS = ("vocab_size", "max_position_embeddings", "hidden_size",
                           "num_layers", "num_heads", "intermediate_size", "pre_layer_norm",
                           "activation")
    FAMILY = "gpt"


def _layer_norm(cfg: GPTConfig, name: str) -> nn.LayerNorm:
    return layers.layer_norm(cfg.layer_norm_epsilon, jnp.dtype(cfg.dtype), name)


def decoder_mask(tokens: Array, segment_ids: Array | None = None,
                 causal_attention: Array | None = None) -> Array:
    """(batch, 1, len, len) attention mask: causal (query sees keys at or before it); with
    `causal_attention`, also every prefix position sees every other prefix position; with
    `segment_ids`, only keys of the query's own packed example."""
    causal = nn.make_causal_mask(tokens)
    if causal_attention is not None:
        prefix = nn.make_attention_mask(causal_attention > 0, causal_attention > 0)
        causal = jnp.logical_or(causal, prefix)
    return nn.combine_masks(
        causal, None if segment_ids is None else nn.make_attention_mask(
            segment_ids, segment_ids, jnp.equal))


class DecoderBlock(nn.Module):
    """Post-LN (GPT-1): x = LN(x + attn(x)); x = LN(x + mlp(x)).
    Pre-LN (GPT-2): x = x + attn(LN(x)); x = x + mlp(LN(x))."""

    config: GPTConfig

    @nn.compact
    def __call__(self, x: Array, mask: Array | None, deterministic: bool,
                 decode: bool = False) -> Array:
        cfg = self.config
        dtype = jnp.dtype(cfg.dtype)
        init = layers.normal(cfg.initializer_range)
        attention = layers.MultiHeadAttention(
            cfg.num_heads, cfg.head_dim, dropout_rate=cfg.attention_dropout_rate, dtype=dtype,
            use_bias=True, kernel_init=init, name="attention")
        mlp = layers.MlpBlock(cfg.intermediate_size, activations=(cfg.activation,), dtype=dtype,
                              use_bias=True, kernel_init=init, name="mlp")
        dropout = nn.Dropout(cfg.dropout_rate)
        if cfg.pre_layer_norm:
            h = _layer_norm(cfg, "attention_norm")(x)
            x = x + dropout(attention(h, h, mask=mask, deterministic=deterministic,
                                      decode=decode), deterministic=deterministic)
            h = _layer_norm(cfg, "mlp_norm")(x)
            return x + dropout(mlp(h), deterministic=deterministic)
        attended = attention(x, x, mask=mask, deterministic=deterministic, decode=decode)
        x = _layer_norm(cfg, "attention_norm")(x + dropout(attended, deterministic=deterministic))
        hidden = dropout(mlp(x), deterministic=deterministic)
        return _layer_norm(cfg, "mlp_norm")(x + hidden)


class DecoderOnly(nn.Module):
    """Token + position embeddings -> dropout -> blocks (-> final LN when pre-LN) -> logits
    against the token embedding (tied)."""

    config: GPTConfig

    def setup(self) -> None:
        cfg = self.config
        init = nn.initializers.normal(stddev=cfg.initializer_range)
        self.words = layers.Embed(cfg.vocab_size, cfg.hidden_size, dtype=jnp.dtype(cfg.dtype),
                                  embedding_init=init, name="token_embeddings")
        self.positions = layers._param(self, "position_embeddings", init,
                                       (cfg.max_position_embeddings, cfg.hidden_size),
                                       ("positions", "embed"))
        self.dropout = nn.Dropout(cfg.dropout_rate)
        self.blocks = [DecoderBlock(cfg, name=f"layers_{i}") for i in range(cfg.num_layers)]
        self.final_norm = _layer_norm(cfg, "final_norm") if cfg.pre_layer_norm else None

    def hidden_states(self, tokens: Array, positions: Array | None = None,
                      segment_ids: Array | None = None, causal_attention: Array | None = None,
                      deterministic: bool = True) -> Array:
        """The last block's output (after the final LN for pre-LN models): what a fine-tuning
        head reads."""
        cfg = self.config
        length = tokens.shape[1]
        if length > cfg.max_position_embeddings:
            raise ValueError(f"Sequence length {length} exceeds the model's "
                             f"{cfg.max_position_embeddings} learned positions.")
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(length), tokens.shape)
        x = self.words(tokens) + jnp.take(self.positions, positions, axis=0).astype(
            jnp.dtype(cfg.dtype))
        x = self.dropout(x, deterministic=deterministic)
        mask = decoder_mask(tokens, segment_ids, causal_attention)
        for block in self.blocks:
            x = block(x, mask, deterministic)
        return x if self.final_norm is None else self.final_norm(x)

    def __call__(self, tokens: Array, positions: Array | None = None,
                 segment_ids: Array | None = None, causal_attention: Array | None = None,
                 deterministic: bool = True) -> Array:
        """Next-token logits (batch, length, vocab)."""
        hidden = self.hidden_states(tokens, positions, segment_ids, causal_attention,
                                    deterministic)
        return self.words.attend(hidden)


@gin.configurable
class DecoderOnlyModel:
    """A decoder-only LM for the trainer (`base.Model`): seqio's `DecoderFeatureConverter`
    batches (a task with only `targets` is a causal LM with loss on every token; one with
    `inputs` too is a prefix LM with loss on the targets and the inputs fully visible),
    cross-entropy per target token with T5's normalisation options."""

    FEATURES = ("decoder_input_tokens", "decoder_target_tokens", "decoder_loss_weights",
                "decoder_segment_ids", "decoder_positions", "decoder_causal_attention")

    def __init__(self, config: GPTConfig | None = None,
                 loss_normalizing_factor: float | str | None = "num_real_target_tokens"
                 ) -> None:
        self.config = config if config is not None else GPTConfig()
        self.module = DecoderOnly(self.config)
        self.loss_normalizing_factor = loss_normalizing_factor

    def init(self, rng: Array) -> dict:
        return self.module.init(rng, jnp.ones((1, 8), jnp.int32))["params"]

    def abstract_params(self) -> dict:
        return jax.eval_shape(self.init, jax.random.key(0))

    def feature_converter(self, pack: bool):
        import seqio

        return seqio.DecoderFeatureConverter(pack=pack)

    def logits(self, params, batch, dropout_rng: Array | None = None) -> Array:
        rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
        return self.module.apply(
            {"params": params}, batch["decoder_input_tokens"], batch.get("decoder_positions"),
            batch.get("decoder_segment_ids"), batch.get("decoder_causal_attention"),
            deterministic=dropout_rng is None, rngs=rngs)

    def loss_sums(self, params, batch, dropout_rng: Array | None = None) -> dict[str, Array]:
        from t5x_like import losses

        logits = self.logits(params, batch, dropout_rng)
        targets = batch["decoder_target_tokens"]
        weights = _target_weights(batch)
        token_loss, z_part = losses.cross_entropy_with_logits(logits, targets, weights)
        correct = (jnp.argmax(logits, -1) == targets).astype(jnp.float32) * weights
        return {"loss_sum": jnp.sum(token_loss), "z_loss_sum": jnp.sum(z_part),
                "correct": jnp.sum(correct), "weight_sum": jnp.sum(weights)}

    def loss_denominators(self, batch) -> dict[str, Array]:
        from t5x_like import losses

        return {"loss_sum": losses.normalizing_factor(jnp.sum(_target_weights(batch)),
                                                      self.loss_normalizing_factor)}

    def metrics(self, sums) -> dict[str, Array]:
        weight = jnp.maximum(sums["weight_sum"], 1.0)
        loss = sums["loss_sum"] / weight
        return {"loss": loss, "accuracy": sums["correct"] / weight,
                "perplexity": jnp.exp(loss), "nonpadding_tokens": jnp.asarray(sums["weight_sum"])}


def _target_weights(batch) -> Array:
    weights = batch.get("decoder_loss_weights")
    if weights is None:
        weights = batch["decoder_target_tokens"] > 0
    return jnp.asarray(weights, jnp.float32)
