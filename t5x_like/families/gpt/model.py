"""Decoder-only Transformer language models: GPT-1 (Radford et al., 2018, section 3.1)
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
import functools
from typing import Mapping

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp

from t5x_like import flops
from t5x_like.models import base, layers

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
    return nn.combine_masks(
        causal,
        None
        if segment_ids is None
        else nn.make_attention_mask(segment_ids, segment_ids, jnp.equal),
    )


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
            self.blocks = layers.scanned_stack(
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


@gin.configurable
class DecoderOnlyModel(base.Model):
    """A decoder-only LM for the trainer (`base.Model`): seqio's `DecoderFeatureConverter`
    batches (a task with only `targets` is a causal LM with loss on every token; one with
    `inputs` too concatenates them, loss on the targets unless `loss_on_targets_only=False`),
    cross-entropy per target token with T5's normalisation options.

    `attention='prefix'` (the T5 paper's prefix LM) lets the inputs attend to each other fully
    (seqio's `decoder_causal_attention`); `'causal'` ignores that feature: the paper's
    "language model" architecture, causal everywhere, on the same text-to-text data.
    """

    FEATURES = (
        "decoder_input_tokens",
        "decoder_target_tokens",
        "decoder_loss_weights",
        "decoder_segment_ids",
        "decoder_positions",
        "decoder_causal_attention",
    )
    PROMPT_FEATURE = "prompt_tokens"
    PROMPT_SHARES_SEQUENCE = True
    ATTENTION_MODES = ("prefix", "causal")

    def __init__(
        self,
        config: GPTConfig | None = None,
        loss_normalizing_factor: float | str | None = "num_real_target_tokens",
        attention: str = "prefix",
        loss_on_targets_only: bool = True,
        start_token_id: int = 0,
        eos_id: int = 1,
        loss_chunk_length: int | None = None,
    ) -> None:
        """`loss_chunk_length`: compute the training loss that many positions at a time
        (`losses.chunked_loss_sums`), never holding the whole batch's logits."""
        if attention not in self.ATTENTION_MODES:
            raise ValueError(
                f"DecoderOnlyModel.attention={attention!r}; choose one of {self.ATTENTION_MODES}."
            )
        self.config = config if config is not None else GPTConfig()
        self.module = DecoderOnly(self.config)
        self.loss_normalizing_factor = loss_normalizing_factor
        self.attention = attention
        self.loss_on_targets_only = loss_on_targets_only
        self.start_token_id = start_token_id
        self.eos_id = eos_id
        self.loss_chunk_length = loss_chunk_length

    def init(self, rng: Array) -> dict:
        return self.module.init(rng, jnp.ones((1, 8), jnp.int32))["params"]

    def abstract_params(self) -> dict:
        return jax.eval_shape(self.init, jax.random.key(0))

    def feature_converter(self, pack: bool):
        import seqio

        return seqio.DecoderFeatureConverter(
            pack=pack, loss_on_targets_only=self.loss_on_targets_only
        )

    def _causal_attention(self, batch) -> Array | None:
        return batch.get("decoder_causal_attention") if self.attention == "prefix" else None

    def logits(
        self, params, batch, dropout_rng: Array | None = None, return_hidden: bool = False
    ) -> Array:
        """(batch, length, vocab) float32 logits, or the final hidden states."""
        rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
        return self.module.apply(
            {"params": params},
            batch["decoder_input_tokens"],
            batch.get("decoder_positions"),
            batch.get("decoder_segment_ids"),
            self._causal_attention(batch),
            deterministic=dropout_rng is None,
            rngs=rngs,
            method=DecoderOnly.hidden_states if return_hidden else None,
        )

    # ----------------------------------------------------------------------------- decoding
    def predict_batch(
        self,
        params,
        batch,
        max_decode_length: int,
        return_scores: bool = False,
        decode=None,
        return_all_beams: bool = False,
        rng: Array | None = None,
    ):
        """Continue each prompt (`batch['prompt_tokens']`, right-padded with 0; a text-to-text
        example's `inputs`) by up to `max_decode_length` tokens on the key/value cache, with
        the same greedy / beam / sampling loops as T5 (`decoding.DecodeConfig`).

        As in training, the model sees the start token, then the prompt: the prompt goes into
        the cache in one pass (fully visible for a prefix LM, causal otherwise), rows are
        left-aligned to end together (padding masked, positions counted from each row's own
        start), and the last prompt position's logits choose the first new token."""
        from t5x_like import decoding

        decode = decode or decoding.DecodeConfig()
        prompt = jnp.asarray(batch[self.PROMPT_FEATURE], jnp.int32)
        batch_size = prompt.shape[0]
        beams = decode.beam_size if decode.method == "beam" else 1
        if beams > 1:
            prompt = decoding.repeat_for_beams(prompt, beams)
        tokens_to_logits, cache = self._prefilled_decoder(params, prompt, max_decode_length)
        ids = dict(start_token_id=self.start_token_id, eos_id=self.eos_id)
        if decode.method == "beam":
            seqs, scores = decoding.beam_search(
                tokens_to_logits, cache, batch_size, beams, max_decode_length, decode.alpha, **ids
            )
            if not return_all_beams:
                seqs, scores = seqs[:, 0], scores[:, 0]
        elif decode.method == "sample":
            seqs, scores = decoding.sample_decode(
                tokens_to_logits,
                cache,
                batch_size,
                max_decode_length,
                rng if rng is not None else jax.random.key(decode.seed),
                decode.temperature,
                decode.top_k,
                decode.top_p,
                **ids,
            )
        else:
            seqs, scores = decoding.greedy_decode(
                tokens_to_logits, cache, batch_size, max_decode_length, **ids
            )
        return (seqs, scores) if return_scores else seqs

    def _prefilled_decoder(self, params, prompt: Array, max_decode_length: int):
        """(tokens_to_logits, cache) for `decoding`'s loops, with the prompt already in the
        cache. The loops' first call (fed the start token) returns the prompt's last logits
        without running the model; later calls write one new token each."""
        rows, prompt_len = prompt.shape
        width = prompt_len + 1  # start token + prompt
        total = width + max_decode_length
        lengths = jnp.sum(prompt > 0, axis=1) + 1
        pad = width - lengths  # left padding per row
        slots = jnp.arange(width)[None, :]
        with_start = jnp.concatenate(
            [jnp.full((rows, 1), self.start_token_id, jnp.int32), prompt], axis=1
        )
        source = jnp.clip(slots - pad[:, None], 0, width - 1)
        real = slots >= pad[:, None]
        tokens = jnp.where(real, jnp.take_along_axis(with_start, source, axis=1), 0)
        positions = jnp.where(real, slots - pad[:, None], 0)
        visible_prefix = real.astype(jnp.int32) if self.attention == "prefix" else None
        key_real = jnp.concatenate([real, jnp.ones((rows, max_decode_length), bool)], axis=1)
        prefill_mask = jnp.logical_and(
            jnp.pad(
                decoder_mask(tokens, None, visible_prefix),
                ((0, 0), (0, 0), (0, 0), (0, max_decode_length)),
            ),
            key_real[:, None, None, :],
        )
        apply = functools.partial(
            self.module.apply, decode=True, max_decode_length=total, mutable=["cache"]
        )
        _, shapes = jax.eval_shape(
            apply,
            {"params": params},
            jnp.zeros((rows, total), jnp.int32),
            mask=jnp.ones((rows, 1, total, total), bool),
        )
        cache = jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype), shapes["cache"])
        logits, variables = apply(
            {"params": params, "cache": cache}, tokens, positions, mask=prefill_mask
        )
        step_mask = key_real[:, None, None, :]

        def tokens_to_logits(token_ids: Array, state):
            def run():
                step_positions = (width + state["step"] - 1 - pad)[:, None]
                out, new = self.module.apply(
                    {"params": params, "cache": state["model"]},
                    token_ids,
                    step_positions,
                    mask=step_mask,
                    decode=True,
                    max_decode_length=total,
                    mutable=["cache"],
                )
                return out, new["cache"]

            def first():
                return state["first_logits"][:, None, :], state["model"]

            out, model_cache = jax.lax.cond(state["step"] > 0, run, first)
            return out, {**state, "model": model_cache, "step": state["step"] + 1}

        state = {
            "model": variables["cache"],
            "first_logits": logits[:, -1],
            "step": jnp.array(0, jnp.int32),
        }
        return tokens_to_logits, state

    def loss_sums(self, params, batch, dropout_rng: Array | None = None) -> dict[str, Array]:
        from t5x_like import losses

        targets = batch["decoder_target_tokens"]
        weights = _target_weights(batch)
        if self.loss_chunk_length:
            hidden = self.logits(params, batch, dropout_rng, return_hidden=True)
            sums = losses.chunked_loss_sums(
                lambda h: self.module.apply(
                    {"params": params}, h, method=DecoderOnly.logits_from_hidden
                ).astype(jnp.float32),
                hidden,
                targets,
                weights,
                self.loss_chunk_length,
            )
        else:
            sums = losses.loss_sums(self.logits(params, batch, dropout_rng), targets, weights)
        return {**sums, "weight_sum": jnp.sum(weights)}

    def loss_denominators(self, batch) -> dict[str, Array]:
        from t5x_like import losses

        return {
            "loss_sum": losses.normalizing_factor(
                jnp.sum(_target_weights(batch)), self.loss_normalizing_factor
            )
        }

    def metrics(self, sums) -> dict[str, Array]:
        weight = jnp.maximum(sums["weight_sum"], 1.0)
        loss = sums["loss_sum"] / weight
        return {
            "loss": loss,
            "accuracy": sums["correct"] / weight,
            "perplexity": jnp.exp(loss),
            "nonpadding_tokens": jnp.asarray(sums["weight_sum"]),
        }


def _target_weights(batch) -> Array:
    weights = batch.get("decoder_loss_weights")
    if weights is None:
        weights = batch["decoder_target_tokens"] > 0
    return jnp.asarray(weights, jnp.float32)
