"""BERT (Devlin et al., 2018, section 3): a post-LayerNorm Transformer encoder with
learned absolute position and segment embeddings, a [CLS] pooler, and the masked-LM and
next-sentence heads.

Shared with T5 (`layers.py`): dense projections, attention and the feed-forward block, with
BERT's differences switched on — biases everywhere, explicit 1/sqrt(d_head) logit scaling,
N(0, 0.02) initialisation, exact (erf) GELU, LayerNorm with bias applied *after* each residual
sum. Parameter names and logical axes follow t5x_like's conventions so the partitioning rules
apply unchanged (new logical names: `positions`, `segments`, `classes`, all replicated).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp

from t5x_like import flops
from t5x_like.models import layers

Array = jax.Array


@gin.configurable
@dataclasses.dataclass(frozen=True)
class BertConfig(layers.HiddenSizeConfig):
    """Dimensions of a BERT model; defaults are BERT-Base (110M parameters, uncased vocab)."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    layer_norm_epsilon: float = 1e-12
    initializer_range: float = 0.02
    dtype: str = "float32"
    attention_implementation: str = "xla"  # layers.ATTENTION_IMPLEMENTATIONS
    remat_policy: str = "none"  # layers.REMAT_POLICIES: activation memory vs recomputation
    # One nn.scan over the layers (compile time flat in depth); parameters under `layers`
    # with a leading layer axis instead of `layers_0..N-1` (checkpoints.scan_layout).
    scan_layers: bool = False

    # Fields that decide parameter shapes and meaning (checked when a checkpoint is loaded).
    ARCHITECTURE_FIELDS = (
        "vocab_size",
        "hidden_size",
        "num_layers",
        "num_heads",
        "intermediate_size",
        "max_position_embeddings",
        "type_vocab_size",
    )
    FAMILY = "bert"

    def __post_init__(self) -> None:
        layers.check_attention_implementation(self.attention_implementation)
        layers.check_remat_policy(self.remat_policy)

    @property
    def position_limit(self) -> int:
        return self.max_position_embeddings

    def forward_flops(self, feature_lengths: Mapping[str, int]) -> int:
        """The encoder over the 'inputs' tokens, the masked-LM head (a dense transform and the
        vocabulary projection) at the 'targets' (predicted) positions and the pooler."""
        length, predictions = (
            int(feature_lengths.get("inputs", 0)),
            int(feature_lengths.get("targets", 0)),
        )
        width = self.hidden_size
        layer = flops.attention_flops(
            length, length, width, self.num_heads, self.head_dim
        ) + flops.mlp_flops(length, width, self.intermediate_size)
        head = 2 * predictions * width * (width + self.vocab_size)
        return self.num_layers * layer + head + 2 * width * width


def layer_norm(cfg: BertConfig, name: str) -> nn.LayerNorm:
    return layers.layer_norm(cfg.layer_norm_epsilon, jnp.dtype(cfg.dtype), name)


class Embeddings(nn.Module):
    """word + absolute position + segment embeddings -> LayerNorm -> dropout. The word table
    is also the masked-LM output layer (`attend`)."""

    config: BertConfig

    def setup(self) -> None:
        cfg = self.config
        init = nn.initializers.normal(stddev=cfg.initializer_range)
        self.words = layers.Embed(
            cfg.vocab_size,
            cfg.hidden_size,
            dtype=jnp.dtype(cfg.dtype),
            embedding_init=init,
            name="word_embeddings",
        )
        self.positions = layers._param(
            self,
            "position_embeddings",
            init,
            (cfg.max_position_embeddings, cfg.hidden_size),
            ("positions", "embed"),
        )
        self.segments = layers._param(
            self,
            "segment_embeddings",
            init,
            (cfg.type_vocab_size, cfg.hidden_size),
            ("segments", "embed"),
        )
        self.norm = layer_norm(cfg, "layer_norm")
        self.dropout = layers.Dropout(cfg.dropout_rate)

    def __call__(self, token_ids: Array, segment_ids: Array, deterministic: bool) -> Array:
        cfg = self.config
        length = token_ids.shape[1]
        if length > cfg.max_position_embeddings:
            raise ValueError(
                f"Sequence length {length} exceeds BERT's "
                f"{cfg.max_position_embeddings} learned positions."
            )
        dtype = jnp.dtype(cfg.dtype)
        # The position table is shared over the batch: `add_shared_bias` sums its gradient
        # as a product on CPU (XLA's own batch sum took 11 ms here, the product 0.2 ms).
        x = layers.add_shared_bias(
            self.words(token_ids), self.positions[None, :length].astype(dtype)
        ) + jnp.take(self.segments, segment_ids, axis=0).astype(dtype)
        return self.dropout(self.norm(x), deterministic=deterministic)

    def attend(self, x: Array) -> Array:
        return self.words.attend(x)


class EncoderLayer(nn.Module):
    """Post-LN block: x = LN(x + drop(attn(x))); x = LN(x + drop(ffn(x)))."""

    config: BertConfig

    @nn.compact
    def __call__(self, x: Array, mask: Array, deterministic: bool) -> Array:
        cfg = self.config
        dtype = jnp.dtype(cfg.dtype)
        init = layers.normal(cfg.initializer_range)
        attended = layers.MultiHeadAttention(
            cfg.num_heads,
            cfg.head_dim,
            dropout_rate=cfg.attention_dropout_rate,
            dtype=dtype,
            use_bias=True,
            kernel_init=init,
            implementation=cfg.attention_implementation,
            name="attention",
        )(x, x, mask=mask, deterministic=deterministic)
        attended = layers.Dropout(cfg.dropout_rate)(attended, deterministic=deterministic)
        x = layer_norm(cfg, "attention_norm")(x + attended)
        hidden = layers.MlpBlock(
            cfg.intermediate_size,
            activations=("gelu_exact",),
            dtype=dtype,
            use_bias=True,
            kernel_init=init,
            name="mlp",
        )(x)
        hidden = layers.Dropout(cfg.dropout_rate)(hidden, deterministic=deterministic)
        return layer_norm(cfg, "mlp_norm")(x + hidden)


class BertEncoder(nn.Module):
    """Embeddings, the layer stack and the [CLS] pooler."""

    config: BertConfig

    def setup(self) -> None:
        cfg = self.config
        self.embeddings = Embeddings(cfg, name="embeddings")
        if cfg.scan_layers:
            self.layers = layers.scanned_stack(
                EncoderLayer, cfg.num_layers, cfg.remat_policy, (3,), num_args=2
            )(cfg, name=layers.SCANNED_STACK)
        else:
            layer = layers.remat(EncoderLayer, cfg.remat_policy, static_argnums=(3,))
            self.layers = [layer(cfg, name=f"layers_{i}") for i in range(cfg.num_layers)]
        # hidden -> hidden projections name their output axis 'mlp' (an array cannot carry the
        # same logical name twice); the rules split it like a feed-forward layer.
        self.pooler = layers.Dense(
            (cfg.hidden_size,),
            ("embed",),
            ("mlp",),
            kernel_init=layers.normal(cfg.initializer_range),
            dtype=jnp.dtype(cfg.dtype),
            use_bias=True,
        )

    def __call__(
        self,
        token_ids: Array,
        segment_ids: Array | None = None,
        input_mask: Array | None = None,
        deterministic: bool = True,
        return_all_layers: bool = False,
    ) -> tuple:
        """(sequence output (batch, length, hidden), pooled [CLS] (batch, hidden)), plus every
        layer's output as a third element with `return_all_layers` (for the feature-based
        approach; per-layer stacks only). `input_mask` defaults to token_ids != 0 ([PAD] is id 0
        in BERT vocabularies)."""
        if return_all_layers and self.config.scan_layers:
            raise ValueError(
                "return_all_layers (the feature-based approach) reads every "
                "layer's output, which a scanned stack does not keep: set "
                "BertConfig.scan_layers=False (checkpoints load in either "
                "layout)."
            )
        if segment_ids is None:
            segment_ids = jnp.zeros_like(token_ids)
        if input_mask is None:
            input_mask = token_ids != 0
        mask = input_mask[:, None, None, :] > 0
        x = self.embeddings(token_ids, segment_ids, deterministic)
        all_layers = []
        if self.config.scan_layers:
            x, _ = self.layers(x, mask, deterministic)
        else:
            for layer in self.layers:
                x = layer(x, mask, deterministic)
                all_layers.append(x)
        pooled = jnp.tanh(self.pooler(x[:, 0]))
        return (x, pooled, all_layers) if return_all_layers else (x, pooled)


class MaskedLMTransform(nn.Module):
    """The masked-LM head before its (tied) output layer: dense + GELU + LayerNorm."""

    config: BertConfig

    @nn.compact
    def __call__(self, x: Array) -> Array:
        cfg = self.config
        x = layers.Dense(
            (cfg.hidden_size,),
            ("embed",),
            ("mlp",),
            kernel_init=layers.normal(cfg.initializer_range),
            dtype=jnp.dtype(cfg.dtype),
            use_bias=True,
            name="transform",
        )(x)
        return layer_norm(cfg, "layer_norm")(nn.gelu(x, approximate=False))


class BertForPreTraining(nn.Module):
    """The encoder with the masked-LM head (output tied to the word embeddings, plus a bias)
    and the next-sentence-prediction head on the pooled [CLS]."""

    config: BertConfig

    def setup(self) -> None:
        cfg = self.config
        self.encoder = BertEncoder(cfg, name="encoder")
        self.mlm = MaskedLMTransform(cfg, name="mlm")
        self.mlm_output_bias = layers._param(
            self, "mlm_output_bias", nn.initializers.zeros, (cfg.vocab_size,), ("vocab",)
        )
        self.nsp = layers.Dense(
            (2,),
            ("embed",),
            ("classes",),
            kernel_init=layers.normal(cfg.initializer_range),
            dtype=jnp.dtype(cfg.dtype),
            use_bias=True,
        )

    def __call__(
        self,
        token_ids: Array,
        segment_ids: Array | None = None,
        input_mask: Array | None = None,
        deterministic: bool = True,
        masked_positions: Array | None = None,
    ) -> dict[str, Array]:
        """Logits of both heads. With `masked_positions` (batch, predictions) the masked-LM
        head runs only at those positions, as the reference's `gather_indexes` does: with a
        30k vocabulary the output layer would otherwise dominate the step."""
        sequence, pooled = self.encoder(token_ids, segment_ids, input_mask, deterministic)
        predicted = sequence
        if masked_positions is not None:
            predicted = jnp.take_along_axis(sequence, masked_positions[..., None], axis=1)
        mlm_logits = layers.add_shared_bias(
            self.encoder.embeddings.attend(self.mlm(predicted)), self.mlm_output_bias
        )
        return {
            "mlm_logits": mlm_logits,
            "nsp_logits": self.nsp(pooled),
            "pooled": pooled,
            "sequence": sequence,
        }


def _head(cfg: BertConfig, features: int, name: str) -> layers.Dense:
    """A fine-tuning output layer: N(0, 0.02) kernel, zero bias (the reference's init)."""
    return layers.Dense(
        (features,),
        ("embed",),
        ("classes",),
        kernel_init=layers.normal(cfg.initializer_range),
        dtype=jnp.float32,
        use_bias=True,
        name=name,
    )


class BertForSequenceClassification(nn.Module):
    """Pooled [CLS] -> dropout -> linear (section 4.1): `num_labels` logits, or one score for
    a regression task such as STS-B."""

    config: BertConfig
    num_labels: int

    @nn.compact
    def __call__(
        self,
        token_ids: Array,
        segment_ids: Array | None = None,
        input_mask: Array | None = None,
        deterministic: bool = True,
    ) -> Array:
        _, pooled = BertEncoder(self.config, name="encoder")(
            token_ids, segment_ids, input_mask, deterministic
        )
        pooled = layers.Dropout(self.config.dropout_rate)(pooled, deterministic=deterministic)
        return _head(self.config, self.num_labels, "classifier")(pooled)


class BertForMultipleChoice(nn.Module):
    """SWAG-style (section 4.4): each (context, choice) pair is one sequence; a vector dotted
    with its pooled [CLS] gives that choice's score, softmaxed over the choices. Inputs are
    (batch, choices, length)."""

    config: BertConfig

    @nn.compact
    def __call__(
        self,
        token_ids: Array,
        segment_ids: Array | None = None,
        input_mask: Array | None = None,
        deterministic: bool = True,
    ) -> Array:
        batch, choices, length = token_ids.shape
        flat = lambda x: None if x is None else x.reshape(batch * choices, length)  # noqa: E731
        _, pooled = BertEncoder(self.config, name="encoder")(
            flat(token_ids), flat(segment_ids), flat(input_mask), deterministic
        )
        pooled = layers.Dropout(self.config.dropout_rate)(pooled, deterministic=deterministic)
        return _head(self.config, 1, "classifier")(pooled).reshape(batch, choices)


class BertForQuestionAnswering(nn.Module):
    """SQuAD (section 4.2): a start vector S and an end vector E dotted with every token's
    final hidden state. Returns (start_logits, end_logits), each (batch, length)."""

    config: BertConfig

    @nn.compact
    def __call__(
        self,
        token_ids: Array,
        segment_ids: Array | None = None,
        input_mask: Array | None = None,
        deterministic: bool = True,
    ) -> tuple[Array, Array]:
        sequence, _ = BertEncoder(self.config, name="encoder")(
            token_ids, segment_ids, input_mask, deterministic
        )
        logits = _head(self.config, 2, "qa_outputs")(sequence)
        return logits[..., 0], logits[..., 1]


class BertForTokenClassification(nn.Module):
    """CoNLL-2003 NER (section 5.3): a label per token from its final hidden state (the first
    piece of each word is the one scored). `feature_based` is the paper's feature-based
    ablation: the encoder is frozen (no gradient reaches it; the optimizer also leaves it
    untouched), the last four layers' outputs are concatenated and a two-layer bidirectional
    LSTM (768 units) runs before the classifier."""

    config: BertConfig
    num_labels: int
    feature_based: bool = False
    lstm_size: int = 768

    @nn.compact
    def __call__(
        self,
        token_ids: Array,
        segment_ids: Array | None = None,
        input_mask: Array | None = None,
        deterministic: bool = True,
    ) -> Array:
        cfg = self.config
        encoder = BertEncoder(cfg, name="encoder")
        if not self.feature_based:
            sequence, _ = encoder(token_ids, segment_ids, input_mask, deterministic)
            x = layers.Dropout(cfg.dropout_rate)(sequence, deterministic=deterministic)
        else:
            _, _, all_layers = encoder(
                token_ids, segment_ids, input_mask, True, return_all_layers=True
            )
            x = jax.lax.stop_gradient(jnp.concatenate(all_layers[-4:], axis=-1))
            lengths = (token_ids != 0).sum(-1) if input_mask is None else input_mask.sum(-1)
            for i in range(2):
                x = BiLSTM(self.lstm_size // 2, name=f"bilstm_{i}")(x, lengths)
        return _head(cfg, self.num_labels, "classifier")(x)


class BiLSTM(nn.Module):
    """A bidirectional LSTM layer, `features` units each way, outputs concatenated."""

    features: int

    @nn.compact
    def __call__(self, x: Array, lengths: Array) -> Array:
        forward = nn.RNN(nn.OptimizedLSTMCell(self.features, parent=None), name="forward")
        backward = nn.RNN(nn.OptimizedLSTMCell(self.features, parent=None), name="backward")
        return nn.Bidirectional(forward, backward)(x, seq_lengths=lengths)
