"""The encoder-decoder model API: loss, score and predict, kept apart from the network.

As in t5x, the Flax module only maps tokens to logits; this wrapper knows the feature names that
seqio's `EncDecFeatureConverter` produces (`encoder_input_tokens`, `decoder_input_tokens`,
`decoder_target_tokens`, `decoder_loss_weights`, and the `*_segment_ids` of packed batches).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Mapping

import gin
import jax
import jax.numpy as jnp
import numpy as np

from t5x_like import decoding, losses
from t5x_like.families.t5 import network as t5
from t5x_like.models import base

if TYPE_CHECKING:
    import seqio

Array = jax.Array
Batch = Mapping[str, Array]
Params = Any


@gin.configurable
class EncoderDecoderModel(base.Model):
    """T5 with its loss, scoring and greedy decoding (a `base.Model`). Without a config it
    builds `T5Config()`, i.e. whatever the model gin file bound."""

    FEATURES = (
        "encoder_input_tokens",
        "encoder_segment_ids",
        "decoder_input_tokens",
        "decoder_target_tokens",
        "decoder_loss_weights",
        "decoder_segment_ids",
    )
    PROMPT_FEATURE = "encoder_input_tokens"

    def __init__(
        self,
        config: t5.T5Config | None = None,
        label_smoothing: float = 0.0,
        z_loss: float = 0.0,
        loss_normalizing_factor: float | str | None = "num_real_target_tokens",
        decoder_start_token_id: int = 0,
        eos_id: int = 1,
        loss_chunk_length: int | None = None,
    ) -> None:
        """`loss_chunk_length`: compute the training loss `loss_chunk_length` target positions
        at a time (`losses.chunked_loss_sums`), never holding the whole batch's logits."""
        self.config = config = config if config is not None else t5.T5Config()
        self.module = t5.Transformer(config)
        self.label_smoothing = label_smoothing
        self.z_loss = z_loss
        self.loss_normalizing_factor = loss_normalizing_factor
        self.decoder_start_token_id = decoder_start_token_id
        self.eos_id = eos_id
        self.loss_chunk_length = loss_chunk_length

    # ----------------------------------------------------------------------------- parameters
    def init(
        self, rng: Array, input_len: int = 8, target_len: int = 8, batch_size: int = 1
    ) -> Params:
        """Parameters (boxed with their logical axis names) for the given shapes."""
        enc = jnp.ones((batch_size, input_len), jnp.int32)
        dec = jnp.ones((batch_size, target_len), jnp.int32)
        return self.module.init(rng, enc, dec)["params"]

    def abstract_params(self, input_len: int = 8, target_len: int = 8) -> Params:
        """Parameter shapes without allocating memory (jax.eval_shape)."""
        return jax.eval_shape(
            functools.partial(self.init, input_len=input_len, target_len=target_len),
            jax.random.key(0),
        )

    # ----------------------------------------------------------------------------- forward
    def logits(
        self,
        params: Params,
        batch: Batch,
        dropout_rng: Array | None = None,
        return_hidden: bool = False,
    ) -> Array:
        """(batch, target length, vocab) float32 logits, or the decoder's final hidden states."""
        rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
        return self.module.apply(
            {"params": params},
            batch["encoder_input_tokens"],
            batch["decoder_input_tokens"],
            batch.get("encoder_segment_ids"),
            batch.get("decoder_segment_ids"),
            enable_dropout=dropout_rng is not None,
            rngs=rngs,
            return_hidden=return_hidden,
        )

    def feature_converter(self, pack: bool) -> seqio.FeatureConverter:
        import seqio  # here: it imports TensorFlow, which the model itself never needs

        return seqio.EncDecFeatureConverter(pack=pack)

    @staticmethod
    def _loss_weights(batch: Batch) -> Array:
        weights = batch.get("decoder_loss_weights")
        if weights is None:
            weights = batch["decoder_target_tokens"] > 0
        return jnp.asarray(weights, jnp.float32)

    def loss_sums(
        self, params: Params, batch: Batch, dropout_rng: Array | None = None
    ) -> dict[str, Array]:
        """Un-normalised sums: loss, z-loss part, correct tokens and loss weight. Sums add up
        across micro-batches, so accumulation equals the full-batch step exactly."""
        targets = batch["decoder_target_tokens"]
        weights = self._loss_weights(batch)
        options = dict(label_smoothing=self.label_smoothing, z_loss=self.z_loss)
        if self.loss_chunk_length:
            hidden = self.logits(params, batch, dropout_rng, return_hidden=True)
            sums = losses.chunked_loss_sums(
                lambda h: self.module.apply(
                    {"params": params}, h, method=t5.Transformer.logits_from_hidden
                ),
                hidden,
                targets,
                weights,
                self.loss_chunk_length,
                **options,
            )
        else:
            sums = losses.loss_sums(
                self.logits(params, batch, dropout_rng), targets, weights, **options
            )
        return {**sums, "weight_sum": jnp.sum(weights)}

    def normalizer(self, weight_sum: Array) -> Array:
        return losses.normalizing_factor(weight_sum, self.loss_normalizing_factor)

    def loss_denominators(self, batch: Batch) -> dict[str, Array]:
        """The summed loss (z-loss included) over `loss_normalizing_factor`."""
        return {"loss_sum": self.normalizer(jnp.sum(self._loss_weights(batch)))}

    def metrics(self, sums: Mapping[str, Array]) -> dict[str, Array]:
        weight = jnp.maximum(sums["weight_sum"], 1.0)
        return {
            "loss": sums["loss_sum"] / weight,  # per target token, whatever the normaliser
            "accuracy": sums["correct"] / weight,
            "z_loss": sums["z_loss_sum"] / weight,
            "nonpadding_tokens": jnp.asarray(sums["weight_sum"]),
        }

    def loss_fn(
        self, params: Params, batch: Batch, dropout_rng: Array | None = None
    ) -> tuple[Array, dict[str, Array]]:
        """Normalised training loss and the metrics' raw sums."""
        sums = self.loss_sums(params, batch, dropout_rng)
        return base.objective(sums, self.loss_denominators(batch)), sums

    def score_batch(self, params: Params, batch: Batch) -> Array:
        """Log-likelihood of each example's targets (summed over its target tokens)."""
        logits = self.logits(params, batch)
        targets = batch["decoder_target_tokens"]
        weights = self._loss_weights(batch)
        return jnp.sum(losses.token_log_likelihood(logits, targets) * weights, axis=-1)

    # ----------------------------------------------------------------------------- decoding
    def init_cache(
        self, params: Params, encoder_input_tokens: Array, max_decode_length: int
    ) -> Any:
        """Zero key/value caches sized for `max_decode_length` decoder positions (shapes from
        an abstract trace: the model is not run)."""
        batch = encoder_input_tokens.shape[0]
        dummy = jnp.zeros((batch, max_decode_length), jnp.int32)
        _, variables = jax.eval_shape(
            functools.partial(
                self.module.apply,
                decode=True,
                max_decode_length=max_decode_length,
                mutable=["cache"],
            ),
            {"params": params},
            encoder_input_tokens,
            dummy,
        )
        return jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype), variables["cache"])

    def decode_step_fn(
        self, params: Params, encoded: Array, encoder_input_tokens: Array, max_decode_length: int
    ) -> decoding.TokensToLogits:
        """The `tokens_to_logits` function for one cached decoder step."""

        def tokens_to_logits(token_ids: Array, cache: Any) -> tuple[Array, Any]:
            logits, variables = self.module.apply(
                {"params": params, "cache": cache},
                encoded,
                encoder_input_tokens,
                token_ids,
                decode=True,
                max_decode_length=max_decode_length,
                mutable=["cache"],
                method=t5.Transformer.decode,
            )
            return logits, variables["cache"]

        return tokens_to_logits

    def predict_batch(
        self,
        params: Params,
        batch: Batch,
        max_decode_length: int,
        return_scores: bool = False,
        decode: decoding.DecodeConfig | None = None,
        return_all_beams: bool = False,
        rng: Array | None = None,
    ) -> Array | tuple[Array, Array]:
        """Decode on the key/value cache: greedy (the paper's test-time decoding, default),
        beam search or sampling, as `decode` says. Scores: summed log-probabilities (greedy,
        sampling) or length-penalised ones (beam). `return_all_beams` gives (batch, beam, len)
        best first instead of the best beam. Sampling draws from `rng` (default: a key from
        `decode.seed`; pass a fresh key per batch for varied samples)."""
        decode = decode or decoding.DecodeConfig()
        inputs = batch["encoder_input_tokens"]
        batch_size = inputs.shape[0]
        encoded = self.module.apply({"params": params}, inputs, method=t5.Transformer.encode)
        ids = dict(start_token_id=self.decoder_start_token_id, eos_id=self.eos_id)
        if decode.method == "beam":
            k = decode.beam_size
            inputs, encoded = decoding.repeat_for_beams((inputs, encoded), k)
            cache = self.init_cache(params, inputs, max_decode_length)
            step = self.decode_step_fn(params, encoded, inputs, max_decode_length)
            beams, beam_scores = decoding.beam_search(
                step, cache, batch_size, k, max_decode_length, **decode.beam_options(), **ids
            )
            tokens, scores = (
                (beams, beam_scores) if return_all_beams else (beams[:, 0], beam_scores[:, 0])
            )
            return (tokens, scores) if return_scores else tokens
        cache = self.init_cache(params, inputs, max_decode_length)
        step = self.decode_step_fn(params, encoded, inputs, max_decode_length)
        if decode.method == "sample":
            tokens, scores = decoding.sample_decode(
                step,
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
            tokens, scores = decoding.greedy_decode(
                step, cache, batch_size, max_decode_length, **ids
            )
        return (tokens, scores) if return_scores else tokens


def shift_right(targets: np.ndarray | Array, start_token_id: int = 0) -> Array:
    """Decoder inputs for unpacked targets: start token, then targets[:-1] (teacher forcing)."""
    targets = jnp.asarray(targets)
    start = jnp.full(targets.shape[:-1] + (1,), start_token_id, targets.dtype)
    return jnp.concatenate([start, targets[..., :-1]], axis=-1)
