"""The decoder-only Transformer network and its config: GPT-1 (Radford et al., 2018, section 3.1)
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
from typing import Any, Mapping

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp

from t5x_like import flops
from t5x_like.models import layers

Array = jax.Array


@gin.configurable
@dataclasses.dataclass(frozen=True)
class GPTConfig(layers.HiddenSizeConfig):
    """Dimensions and layer style of a decoder-only model; defaults are GPT-1 (117M
    parameters, 40,478-entry BPE vocabulary, 512 positions).

    The T5 paper's language models (Table 2) are the same network with T5 layers:
    `norm='rms_norm'`, `use_bias=False`, `position_encoding='relative'` (one bias table for the
    stack, unidirectional buckets as T5's decoder, or bidirectional for a prefix LM so prefix
    tokens tell keys after them apart), `activation='relu'` (v1.0) or `'gated-gelu'` (v1.1),
    `initialization='t5'` (T5's fan-in init; tied logits scaled by hidden_size**-0.5 like T5
    v1.0) and `tie_embeddings=False` for v1.1's separate output layer.
    """

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
    norm: str = "layer_norm"  # or 'rms_norm' (T5)
    use_bias: bool = True
    position_encoding: str = "learned"  # or 'relative' (T5's bucketed bias)
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    relative_attention_bidirectional: bool = False
    initialization: str = "normal"  # N(0, initializer_range); or 't5'
    tie_embeddings: bool = True
    scale_residual_init: bool = False  # GPT-2: output projections' std / sqrt(2 * num_layers)
    # GPT-1 fine-tuning's learned start / delimiter / extract tokens: embedding rows after the
    # vocabulary (ids vocab_size, vocab_size + 1, ...), added to a pretrained model's table.
    num_special_tokens: int = 0
    remat_policy: str = "none"  # layers.REMAT_POLICIES: activation memory vs recomputation
    attention_implementation: str = "xla"  # layers.ATTENTION_IMPLEMENTATIONS
    # One nn.scan over the blocks (compile time flat in depth); parameters under `layers`
    # with a leading layer axis instead of `layers_0..N-1` (checkpoints.scan_layout).
    scan_layers: bool = False

    ARCHITECTURE_FIELDS = (
        "vocab_size",
        "max_position_embeddings",
        "hidden_size",
        "num_layers",
        "num_heads",
        "intermediate_size",
        "pre_layer_norm",
        "activation",
        "norm",
        "use_bias",
        "position_encoding",
        "relative_attention_num_buckets",
        "relative_attention_max_distance",
        "relative_attention_bidirectional",
        "tie_embeddings",
    )
    FAMILY = "gpt"

    def __post_init__(self) -> None:
        choices = {
            "norm": ("layer_norm", "rms_norm"),
            "position_encoding": ("learned", "relative"),
            "initialization": ("normal", "t5"),
        }
        for field, allowed in choices.items():
            if getattr(self, field) not in allowed:
                raise ValueError(
                    f"GPTConfig.{field}={getattr(self, field)!r}; choose one of {allowed}."
                )
        layers.check_remat_policy(self.remat_policy)
        layers.check_attention_implementation(self.attention_implementation)

    @property
    def activations(self) -> tuple[str, ...]:
        """MlpBlock activations: 'gated-gelu' is T5 v1.1's GEGLU."""
        return ("gelu", "linear") if self.activation == "gated-gelu" else (self.activation,)

    @property
    def embedding_rows(self) -> int:
        return self.vocab_size + self.num_special_tokens

    @property
    def learned_positions(self) -> bool:
        return self.position_encoding == "learned"

    @property
    def position_limit(self) -> int | None:
        return self.max_position_embeddings if self.learned_positions else None

    def forward_flops(self, feature_lengths: Mapping[str, int]) -> int:
        """One row of inputs and targets concatenated, logits at every position."""
        length = int(feature_lengths.get("inputs", 0)) + int(feature_lengths.get("targets", 0))
        width = self.hidden_size
        layer = flops.attention_flops(
            length, length, width, self.num_heads, self.head_dim
        ) + flops.mlp_flops(length, width, self.intermediate_size, len(self.activations))
        return self.num_layers * layer + 2 * length * width * self.vocab_size


def _norm(cfg: GPTConfig, name: str) -> nn.Module:
    if cfg.norm == "rms_norm":
        return layers.RMSNorm(epsilon=cfg.layer_norm_epsilon, dtype=jnp.dtype(cfg.dtype), name=name)
    return layers.layer_norm(cfg.layer_norm_epsilon, jnp.dtype(cfg.dtype), name)


def _kernel_inits(cfg: GPTConfig) -> tuple:
    """(attention kernel init, MLP kernel init, output-projection init) for the config's
    initialisation. None for attention = T5's fan-in init with the 1/sqrt(d_head) logit scale
    folded into the query's."""
    if cfg.initialization == "t5":
        return None, layers.fan_in_normal(), None
    init = layers.normal(cfg.initializer_range)
    scaled = (
        layers.normal(cfg.initializer_range / (2 * cfg.num_layers) ** 0.5)
        if cfg.scale_residual_init
        else None
    )
    return init, init, scaled


def decoder_mask(
    tokens: Array, segment_ids: Array | None = None, causal_attention: Array | None = None
) -> Array:
    """(batch, 1, len, len) attention mask: causal (query sees keys at or before it); with
    `causal_attention`, also every prefix position sees every other prefix position; with
    `segment_ids`, only keys of the query's own packed example."""
    causal = nn.make_causal_mask(tokens)
    if causal_attention is not None:
        prefix = nn.make_attention_mask(causal_attention > 0, causal_attention > 0)
        causal = jnp.logical_or(causal, prefix)
    mask = nn.combine_masks(
        causal,
        None
        if segment_ids is None
        else nn.make_attention_mask(segment_ids, segment_ids, jnp.equal),
    )
    assert mask is not None  # the causal mask is always there
    return mask


class DecoderBlock(nn.Module):
    """Post-LN (GPT-1): x = LN(x + attn(x)); x = LN(x + mlp(x)).
    Pre-LN (GPT-2, T5): x = x + attn(LN(x)); x = x + mlp(LN(x))."""

    config: GPTConfig

    @nn.compact
    def __call__(
        self,
        x: Array,
        mask: Array | None,
        deterministic: bool,
        decode: bool = False,
        bias: Array | None = None,
    ) -> Array:
        cfg = self.config
        dtype = jnp.dtype(cfg.dtype)
        attention_init, mlp_init, output_init = _kernel_inits(cfg)
        attention = layers.MultiHeadAttention(
            cfg.num_heads,
            cfg.head_dim,
            dropout_rate=cfg.attention_dropout_rate,
            dtype=dtype,
            use_bias=cfg.use_bias,
            kernel_init=attention_init,
            output_kernel_init=output_init,
            implementation=cfg.attention_implementation,
            name="attention",
        )
        mlp = layers.MlpBlock(
            cfg.intermediate_size,
            activations=cfg.activations,
            dtype=dtype,
            use_bias=cfg.use_bias,
            kernel_init=mlp_init,
            output_kernel_init=output_init,
            name="mlp",
        )
        dropout = layers.Dropout(cfg.dropout_rate)
        if cfg.pre_layer_norm:
            h = _norm(cfg, "attention_norm")(x)
            x = x + dropout(
                attention(h, h, mask=mask, bias=bias, deterministic=deterministic, decode=decode),
                deterministic=deterministic,
            )
            h = _norm(cfg, "mlp_norm")(x)
            return x + dropout(mlp(h), deterministic=deterministic)
        attended = attention(x, x, mask=mask, bias=bias, deterministic=deterministic, decode=decode)
        x = _norm(cfg, "attention_norm")(x + dropout(attended, deterministic=deterministic))
        hidden = dropout(mlp(x), deterministic=deterministic)
        return _norm(cfg, "mlp_norm")(x + hidden)


class DecoderOnly(nn.Module):
    """Token (+ learned position) embeddings -> dropout -> blocks (with the stack's relative
    position bias when T5-style) (-> final norm when pre-LN) -> logits against the token
    embedding (tied) or a separate output layer."""

    config: GPTConfig

    def setup(self) -> None:
        cfg = self.config
        dtype = jnp.dtype(cfg.dtype)
        embedding_init = (
            nn.initializers.normal(stddev=1.0)
            if cfg.initialization == "t5"
            else nn.initializers.normal(stddev=cfg.initializer_range)
        )
        self.words = layers.Embed(
            cfg.embedding_rows,
            cfg.hidden_size,
            dtype=dtype,
            embedding_init=embedding_init,
            name="token_embeddings",
        )
        if cfg.learned_positions:
            self.positions = layers._param(
                self,
                "position_embeddings",
                embedding_init,
                (cfg.max_position_embeddings, cfg.hidden_size),
                ("positions", "embed"),
            )
        else:
            self.relpos = layers.RelativePositionBias(
                num_buckets=cfg.relative_attention_num_buckets,
                max_distance=cfg.relative_attention_max_distance,
                num_heads=cfg.num_heads,
                bidirectional=cfg.relative_attention_bidirectional,
                dtype=dtype,
                name="relpos_bias",
            )
        self.dropout = layers.Dropout(cfg.dropout_rate)
        if cfg.scan_layers:
            self.blocks: Any = layers.scanned_stack(
                DecoderBlock, cfg.num_layers, cfg.remat_policy, (3, 4), num_args=4
            )(cfg, name=layers.SCANNED_STACK)
        else:
            block = layers.remat(DecoderBlock, cfg.remat_policy, static_argnums=(3, 4))
            self.blocks = [block(cfg, name=f"layers_{i}") for i in range(cfg.num_layers)]
        self.final_norm = _norm(cfg, "final_norm") if cfg.pre_layer_norm else None
        if not cfg.tie_embeddings:
            self.logits_dense = layers.Dense(
                (cfg.embedding_rows,),
                ("embed",),
                ("vocab",),
                dtype=dtype,
                kernel_init=(
                    layers.fan_in_normal()
                    if cfg.initialization == "t5"
                    else layers.normal(cfg.initializer_range)
                ),
                name="logits_dense",
            )

    def hidden_states(
        self,
        tokens: Array,
        positions: Array | None = None,
        segment_ids: Array | None = None,
        causal_attention: Array | None = None,
        deterministic: bool = True,
        mask: Array | None = None,
        decode: bool = False,
        max_decode_length: int | None = None,
    ) -> Array:
        """The last block's output (after the final norm for pre-LN models): what a
        fine-tuning head reads. With `decode`, the new positions go into the key/value cache
        (sized `max_decode_length`) and `mask` must cover the whole cache."""
        cfg = self.config
        length = max_decode_length if decode and max_decode_length else tokens.shape[1]
        if cfg.learned_positions and length > cfg.max_position_embeddings:
            raise ValueError(
                f"Sequence length {length} exceeds the model's "
                f"{cfg.max_position_embeddings} learned positions; shorten the "
                "task feature lengths or use a model with more positions."
            )
        x = self.words(tokens)
        if cfg.learned_positions:
            if positions is None:
                positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
            x = x + jnp.take(self.positions, positions, axis=0).astype(jnp.dtype(cfg.dtype))
        bias = None if cfg.learned_positions else self.relpos(length, length)
        x = self.dropout(x, deterministic=deterministic)
        if mask is None and not decode:
            mask = decoder_mask(tokens, segment_ids, causal_attention)
        if cfg.scan_layers:
            x, _ = self.blocks(x, mask, deterministic, decode, bias)
        else:
            for block in self.blocks:
                x = block(x, mask, deterministic, decode, bias)
        return x if self.final_norm is None else self.final_norm(x)

    def logits_from_hidden(self, hidden: Array) -> Array:
        cfg = self.config
        if not cfg.tie_embeddings:
            return self.logits_dense(hidden)
        if cfg.initialization == "t5":
            hidden = hidden * cfg.hidden_size**-0.5
        return self.words.attend(hidden)

    def __call__(
        self,
        tokens: Array,
        positions: Array | None = None,
        segment_ids: Array | None = None,
        causal_attention: Array | None = None,
        deterministic: bool = True,
        mask: Array | None = None,
        decode: bool = False,
        max_decode_length: int | None = None,
    ) -> Array:
        """Next-token logits (batch, length, vocab)."""
        hidden = self.hidden_states(
            tokens,
            positions,
            segment_ids,
            causal_attention,
            deterministic,
            mask,
            decode,
            max_decode_length,
        )
        return self.logits_from_hidden(hidden).astype(jnp.float32)
