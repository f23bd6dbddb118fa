"""The T5 encoder-decoder network (Raffel et al., 2020, section 3.1.1), v1.0 and v1.1 from
one module.

Parameter names follow t5x (`token_embedder`, `encoder/layers_0/attention/query`, ...), so the
tree reads the same as the checkpoints users already know.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Mapping, Sequence

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp

from t5x_like import flops
from t5x_like.models import base, flash_attention, layers

Array = jax.Array

ACTIVATION_AXES = ("batch", "length", "embed")


def _constrain(x: Array, axes: tuple[str, ...] = ACTIVATION_AXES) -> Array:
    """Sharding hint for XLA (a no-op unless partitioning rules and a mesh are in context)."""
    return nn.with_logical_constraint(x, axes)


@gin.configurable
@dataclasses.dataclass(frozen=True)
class T5Config(base.ModelConfig):
    """Dimensions and switches of a T5 model. Defaults are T5 v1.0 Small.

    `logits_via_embedding=True` ties the output layer to the input embedding and scales the
    decoder output by emb_dim**-0.5 first (v1.0); False gives a separate `logits_dense` layer
    initialised with std emb_dim**-0.5 (v1.1).

    `shared_encoder_decoder=True` is the T5 paper's "encoder-decoder, shared" (Table 2): one
    stack of layers used twice, the decoder adding only its cross-attention (with its norm),
    its own relative-position table and final norm. The "L/2 + L/2" row is plain layer counts.

    `remat_policy` (`layers.REMAT_POLICIES`) trades compute for activation memory per layer;
    it changes neither parameters nor results. `scan_layers` runs each stack as one `nn.scan`
    (compile time flat in depth); its parameters are stacked under `layers` instead of
    `layers_0..N-1` (`checkpoints.scan_layout` converts either way).
    """

    vocab_size: int = 32128
    emb_dim: int = 512
    num_heads: int = 8
    head_dim: int = 64
    mlp_dim: int = 2048
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    mlp_activations: Sequence[str] = ("relu",)
    dropout_rate: float = 0.1
    logits_via_embedding: bool = True
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    dtype: str = "float32"
    float32_attention_logits: bool = True
    shared_encoder_decoder: bool = False
    remat_policy: str = "none"
    attention_implementation: str = "xla"  # layers.ATTENTION_IMPLEMENTATIONS
    scan_layers: bool = False

    FAMILY = "t5"
    # Fields that decide parameter shapes and meaning; dropout, dtype and the like may differ
    # between pretraining and fine-tuning.
    ARCHITECTURE_FIELDS = (
        "vocab_size",
        "emb_dim",
        "num_heads",
        "head_dim",
        "mlp_dim",
        "num_encoder_layers",
        "num_decoder_layers",
        "mlp_activations",
        "logits_via_embedding",
        "relative_attention_num_buckets",
    )

    def __post_init__(self) -> None:
        # Gin hands lists; keep the config hashable so it can be a static jit argument.
        object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))
        layers.check_remat_policy(self.remat_policy)
        layers.check_attention_implementation(self.attention_implementation, flash=True)
        if self.shared_encoder_decoder and self.remat_policy != "none":
            raise ValueError(
                "remat_policy needs shared_encoder_decoder=False: a shared layer "
                "runs the decoder's cross-attention inside it, which a "
                "rematerialised layer cannot call."
            )
        if self.shared_encoder_decoder and self.scan_layers:
            raise ValueError(
                "scan_layers needs shared_encoder_decoder=False: the decoder of a "
                "shared model calls the encoder's layers one by one."
            )

    @property
    def jnp_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    def forward_flops(self, feature_lengths: Mapping[str, int]) -> int:
        """The encoder over the inputs, the decoder over the targets (self- and
        cross-attention), the vocabulary projection over the targets. Shared parameters do
        not change the count: the stack still runs twice."""
        inputs, targets = (
            int(feature_lengths.get("inputs", 0)),
            int(feature_lengths.get("targets", 0)),
        )
        projections = len(self.mlp_activations)
        width, heads, head_dim = self.emb_dim, self.num_heads, self.head_dim
        encoder_layer = flops.attention_flops(
            inputs, inputs, width, heads, head_dim
        ) + flops.mlp_flops(inputs, width, self.mlp_dim, projections)
        decoder_layer = (
            flops.attention_flops(targets, targets, width, heads, head_dim)
            + flops.attention_flops(targets, inputs, width, heads, head_dim)
            + flops.mlp_flops(targets, width, self.mlp_dim, projections)
        )
        logits = 2 * targets * width * self.vocab_size
        return (
            self.num_encoder_layers * encoder_layer
            + self.num_decoder_layers * decoder_layer
            + logits
        )


def _attention(cfg: T5Config, name: str) -> layers.MultiHeadAttention:
    return layers.MultiHeadAttention(
        num_heads=cfg.num_heads,
        head_dim=cfg.head_dim,
        dropout_rate=cfg.dropout_rate,
        dtype=cfg.jnp_dtype,
        float32_logits=cfg.float32_attention_logits,
        implementation=cfg.attention_implementation,
        name=name,
    )


def _norm(cfg: T5Config, name: str | None) -> layers.RMSNorm:
    return layers.RMSNorm(epsilon=cfg.layer_norm_epsilon, dtype=cfg.jnp_dtype, name=name)


def _relpos(
    cfg: T5Config, bidirectional: bool, name: str | None = "relpos_bias"
) -> layers.RelativePositionBias:
    return layers.RelativePositionBias(
        num_buckets=cfg.relative_attention_num_buckets,
        max_distance=cfg.relative_attention_max_distance,
        num_heads=cfg.num_heads,
        bidirectional=bidirectional,
        dtype=cfg.jnp_dtype,
        name=name,
    )


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each pre-normed with a residual. `between` (used by
    the shared encoder-decoder's decoder) runs between the two: its cross-attention."""

    cfg: T5Config

    @nn.compact
    def __call__(
        self,
        x: Array,
        mask: Array | None,
        bias: Array,
        deterministic: bool,
        decode: bool = False,
        between: Callable[[Array], Array] | None = None,
    ) -> Array:
        cfg = self.cfg
        dropout = layers.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
        h = _norm(cfg, "pre_attention_layer_norm")(x)
        h = _attention(cfg, "attention")(h, h, mask, bias, deterministic, decode)
        x = x + dropout(h, deterministic=deterministic)
        if between is not None:
            x = between(x)
        h = _norm(cfg, "pre_mlp_layer_norm")(x)
        h = layers.MlpBlock(
            cfg.mlp_dim, cfg.mlp_activations, cfg.dropout_rate, cfg.jnp_dtype, name="mlp"
        )(h, deterministic)
        return x + dropout(h, deterministic=deterministic)


def _cross_attention_block(
    cfg: T5Config, encoded: Array, cross_mask: Array | None, deterministic: bool
) -> Callable[[Array], Array]:
    """Pre-normed encoder-decoder attention with its residual, as a function of the decoder
    state (its modules belong to the calling decoder layer)."""
    norm = _norm(cfg, "pre_cross_attention_layer_norm")
    attention = _attention(cfg, "encoder_decoder_attention")
    dropout = layers.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))

    def block(x: Array) -> Array:
        h = attention(norm(x), encoded, cross_mask, None, deterministic)
        return x + dropout(h, deterministic=deterministic)

    return block


class DecoderLayer(nn.Module):
    cfg: T5Config

    @nn.compact
    def __call__(
        self,
        x: Array,
        encoded: Array,
        self_mask: Array | None,
        cross_mask: Array | None,
        bias: Array,
        deterministic: bool,
        decode: bool = False,
    ) -> Array:
        cfg = self.cfg
        dropout = layers.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
        h = _norm(cfg, "pre_self_attention_layer_norm")(x)
        h = _attention(cfg, "self_attention")(h, h, self_mask, bias, deterministic, decode)
        x = x + dropout(h, deterministic=deterministic)
        x = _cross_attention_block(cfg, encoded, cross_mask, deterministic)(x)
        h = _norm(cfg, "pre_mlp_layer_norm")(x)
        h = layers.MlpBlock(
            cfg.mlp_dim, cfg.mlp_activations, cfg.dropout_rate, cfg.jnp_dtype, name="mlp"
        )(h, deterministic)
        return x + dropout(h, deterministic=deterministic)


class SharedDecoderLayer(nn.Module):
    """A decoder layer of the shared encoder-decoder: the encoder's layer `shared` (its
    self-attention, now causal and cached, and its feed-forward) with this layer's own
    cross-attention between them."""

    cfg: T5Config
    shared: nn.Module

    @nn.compact
    def __call__(
        self,
        x: Array,
        encoded: Array,
        self_mask: Array | None,
        cross_mask: Array | None,
        bias: Array,
        deterministic: bool,
        decode: bool = False,
    ) -> Array:
        cross = _cross_attention_block(self.cfg, encoded, cross_mask, deterministic)
        return self.shared(x, self_mask, bias, deterministic, decode, between=cross)


class Encoder(nn.Module):
    cfg: T5Config
    shared_embedding: nn.Module

    def setup(self) -> None:
        cfg = self.cfg
        self.relpos_bias = _relpos(cfg, bidirectional=True, name=None)
        if cfg.scan_layers:
            self.layers = layers.scanned_stack(
                EncoderLayer, cfg.num_encoder_layers, cfg.remat_policy, (4, 5, 6), num_args=5
            )(cfg)
        else:
            layer = layers.remat(EncoderLayer, cfg.remat_policy, static_argnums=(4, 5, 6))
            self.layers = [layer(cfg) for _ in range(cfg.num_encoder_layers)]
        self.encoder_norm = _norm(cfg, None)
        self.dropout = layers.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))

    def __call__(self, tokens: Array, mask: Array, deterministic: bool) -> Array:
        x = _constrain(self.dropout(self.shared_embedding(tokens), deterministic=deterministic))
        length = tokens.shape[-1]
        bias = self.relpos_bias(length, length, isinstance(mask, flash_attention.FlashMask))
        if self.cfg.scan_layers:
            x, _ = self.layers(x, mask, bias, deterministic, False, None)
        else:
            for layer in self.layers:
                x = _constrain(layer(x, mask, bias, deterministic, False, None))
        x = self.encoder_norm(x)
        return _constrain(self.dropout(x, deterministic=deterministic))


class Decoder(nn.Module):
    cfg: T5Config
    shared_embedding: nn.Module
    encoder: nn.Module | None = None  # set: reuse its layers (shared encoder-decoder)

    def setup(self) -> None:
        cfg = self.cfg
        if not cfg.logits_via_embedding:
            self.logits_dense = layers.Dense(
                (cfg.vocab_size,), ("embed",), ("vocab",), dtype=cfg.jnp_dtype
            )

    @nn.compact
    def __call__(
        self,
        encoded: Array,
        decoder_input_tokens: Array,
        self_mask: Array | None,
        cross_mask: Array | None,
        deterministic: bool,
        decode: bool = False,
        max_decode_length: int | None = None,
        return_hidden: bool = False,
    ) -> Array:
        """Logits (batch, length, vocab), or with `return_hidden` the final hidden states that
        `logits_from_hidden` projects (a chunked loss does that a slice at a time)."""
        cfg = self.cfg
        dropout = layers.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
        x = _constrain(
            dropout(self.shared_embedding(decoder_input_tokens), deterministic=deterministic)
        )
        length = max_decode_length if decode and max_decode_length else x.shape[-2]
        structured = isinstance(self_mask, flash_attention.FlashMask)
        bias = _relpos(cfg, bidirectional=False)(length, length, structured)
        if cfg.scan_layers:
            stack = layers.scanned_stack(
                DecoderLayer, cfg.num_decoder_layers, cfg.remat_policy, (6, 7), num_args=6
            )(cfg, name=layers.SCANNED_STACK)
            x, _ = stack(x, encoded, self_mask, cross_mask, bias, deterministic, decode)
        else:
            decoder_layer = layers.remat(DecoderLayer, cfg.remat_policy, static_argnums=(6, 7))
            for i in range(cfg.num_decoder_layers):
                layer = (
                    decoder_layer(cfg, name=f"layers_{i}")
                    if self.encoder is None
                    else SharedDecoderLayer(cfg, self.encoder.layers[i], name=f"layers_{i}")
                )
                x = _constrain(
                    layer(x, encoded, self_mask, cross_mask, bias, deterministic, decode)
                )
        x = _norm(cfg, "decoder_norm")(x)
        x = dropout(x, deterministic=deterministic)
        return x if return_hidden else self.logits_from_hidden(x)

    def logits_from_hidden(self, x: Array) -> Array:
        """The output layer: the tied embedding (after scaling by emb_dim**-0.5) or
        `logits_dense`; float32 logits."""
        cfg = self.cfg
        if cfg.logits_via_embedding:
            logits = self.shared_embedding.attend(x * (cfg.emb_dim**-0.5))
        else:
            logits = self.logits_dense(x)
        return _constrain(logits.astype(jnp.float32), ("batch", "length", "vocab"))


def encoder_self_mask(tokens: Array, segment_ids: Array | None = None) -> Array:
    """(batch, 1, len, len): real tokens see real tokens of their own packed example."""
    return nn.combine_masks(
        nn.make_attention_mask(tokens > 0, tokens > 0),
        None
        if segment_ids is None
        else nn.make_attention_mask(segment_ids, segment_ids, jnp.equal),
    )


def decoder_self_mask(decoder_input_tokens: Array, segment_ids: Array | None = None) -> Array:
    """(batch, 1, len, len): causal, and within one packed example.

    Decoder inputs start with token 0 (the start token), so they cannot mark padding; none is
    needed: padding sits at the end, where causality already hides it from real positions, and
    padded positions carry zero loss weight.
    """
    return nn.combine_masks(
        nn.make_causal_mask(decoder_input_tokens),
        None
        if segment_ids is None
        else nn.make_attention_mask(segment_ids, segment_ids, jnp.equal),
    )


def cross_attention_mask(
    decoder_input_tokens: Array,
    encoder_input_tokens: Array,
    decoder_segment_ids: Array | None = None,
    encoder_segment_ids: Array | None = None,
) -> Array:
    """(batch, 1, dec_len, enc_len): real encoder tokens of the same packed example."""
    return nn.combine_masks(
        nn.make_attention_mask(jnp.ones_like(decoder_input_tokens) > 0, encoder_input_tokens > 0),
        None
        if decoder_segment_ids is None
        else nn.make_attention_mask(decoder_segment_ids, encoder_segment_ids, jnp.equal),
    )


class Transformer(nn.Module):
    """T5 encoder-decoder. Token id 0 is padding; segment ids separate packed examples."""

    config: T5Config

    def setup(self) -> None:
        cfg = self.config
        self.token_embedder = layers.Embed(cfg.vocab_size, cfg.emb_dim, dtype=cfg.jnp_dtype)
        if cfg.shared_encoder_decoder and cfg.num_encoder_layers != cfg.num_decoder_layers:
            raise ValueError(
                "A shared encoder-decoder uses one stack twice: set "
                "num_encoder_layers == num_decoder_layers "
                f"(got {cfg.num_encoder_layers} and {cfg.num_decoder_layers})."
            )
        self.encoder = Encoder(cfg, self.token_embedder)
        self.decoder = Decoder(
            cfg, self.token_embedder, self.encoder if cfg.shared_encoder_decoder else None
        )

    def _flash(self, enable_dropout: bool) -> bool:
        """Whether attention runs the flash kernel: chosen, and no attention dropout (the
        kernel has none)."""
        cfg = self.config
        return cfg.attention_implementation == "flash" and not (
            enable_dropout and cfg.dropout_rate > 0
        )

    def encode(
        self,
        encoder_input_tokens: Array,
        encoder_segment_ids: Array | None = None,
        enable_dropout: bool = False,
    ) -> Array:
        if self._flash(enable_dropout):
            real = encoder_input_tokens > 0
            mask = flash_attention.FlashMask(
                flash_attention.ids_from_segments(real, encoder_segment_ids, -1),
                flash_attention.ids_from_segments(real, encoder_segment_ids, -2),
            )
        else:
            mask = encoder_self_mask(encoder_input_tokens, encoder_segment_ids)
        return self.encoder(encoder_input_tokens, mask, deterministic=not enable_dropout)

    def decode(
        self,
        encoded: Array,
        encoder_input_tokens: Array,
        decoder_input_tokens: Array,
        encoder_segment_ids: Array | None = None,
        decoder_segment_ids: Array | None = None,
        enable_dropout: bool = False,
        decode: bool = False,
        max_decode_length: int | None = None,
        return_hidden: bool = False,
    ) -> Array:
        if decode:
            # One new position per call: causality comes from the cache's fill level.
            self_mask = None
            cross_mask = cross_attention_mask(decoder_input_tokens, encoder_input_tokens)
        elif self._flash(enable_dropout):  # the same three masks, as the kernel takes them
            ids = functools.partial(
                flash_attention.ids_from_segments,
                jnp.ones(decoder_input_tokens.shape, bool),
                decoder_segment_ids,
            )
            self_mask = flash_attention.FlashMask(ids(-1), ids(-1), causal=True)
            cross_mask = flash_attention.FlashMask(
                ids(-1),
                flash_attention.ids_from_segments(
                    encoder_input_tokens > 0, encoder_segment_ids, -2
                ),
            )
        else:
            self_mask = decoder_self_mask(decoder_input_tokens, decoder_segment_ids)
            cross_mask = cross_attention_mask(
                decoder_input_tokens, encoder_input_tokens, decoder_segment_ids, encoder_segment_ids
            )
        return self.decoder(
            encoded,
            decoder_input_tokens,
            self_mask,
            cross_mask,
            deterministic=not enable_dropout,
            decode=decode,
            max_decode_length=max_decode_length,
            return_hidden=return_hidden,
        )

    def logits_from_hidden(self, hidden: Array) -> Array:
        return self.decoder.logits_from_hidden(hidden)

    def __call__(
        self,
        encoder_input_tokens: Array,
        decoder_input_tokens: Array,
        encoder_segment_ids: Array | None = None,
        decoder_segment_ids: Array | None = None,
        enable_dropout: bool = False,
        decode: bool = False,
        max_decode_length: int | None = None,
        return_hidden: bool = False,
    ) -> Array:
        encoded = self.encode(encoder_input_tokens, encoder_segment_ids, enable_dropout)
        return self.decode(
            encoded,
            encoder_input_tokens,
            decoder_input_tokens,
            encoder_segment_ids,
            decoder_segment_ids,
            enable_dropout,
            decode=decode,
            max_decode_length=max_decode_length,
            return_hidden=return_hidden,
        )
