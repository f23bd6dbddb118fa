"""The decoder-only language model the trainer drives (`base.Model`): the network of
`network.py` with its features, loss, generation on the key/value cache and scoring.
"""

from __future__ import annotations

import functools

import gin
import jax
import jax.numpy as jnp

from t5x_like.families.gpt.network import DecoderOnly, GPTConfig, decoder_mask
from t5x_like.models import base

Array = jax.Array


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
        start_token_id: int | None = 0,
        eos_id: int | None = 1,
        loss_chunk_length: int | None = None,
    ) -> None:
        """`loss_chunk_length`: compute the training loss that many positions at a time
        (`losses.chunked_loss_sums`), never holding the whole batch's logits.

        `start_token_id` and `eos_id` are the model's own conventions: this codebase's models
        (seqio's decoder feature converter) see id 0 before each sequence and end at EOS 1;
        an imported GPT-2 has no start token (None: the prompt goes in as it is, as
        transformers' `generate` feeds it) and ends at `<|endoftext|>` (50256), and OpenAI's
        GPT-1 has neither (None: generation runs to its length)."""
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
        """Continue each prompt (`batch['prompt_tokens']`, right-padded; a text-to-text
        example's `inputs`) by up to `max_decode_length` tokens on the key/value cache, with
        the same greedy / beam / sampling loops as T5 (`decoding.DecodeConfig`).

        Each row's length is `batch['prompt_lengths']` when given, and otherwise its count of
        non-zero ids: this codebase's vocabularies pad with 0, but in GPT-2's id 0 is '!', so
        a prompt in an imported GPT-2's vocabulary comes with its lengths. As in training, the
        model sees the start token (if it has one), then the prompt: the prompt goes into the
        cache in one pass (fully visible for a prefix LM, causal otherwise), rows are
        left-aligned to end together (padding masked, positions counted from each row's own
        start), and the last prompt position's logits choose the first new token."""
        from t5x_like import decoding

        decode = decode or decoding.DecodeConfig()
        prompt = jnp.asarray(batch[self.PROMPT_FEATURE], jnp.int32)
        lengths = (
            jnp.asarray(batch["prompt_lengths"], jnp.int32)
            if "prompt_lengths" in batch
            else jnp.sum(prompt > 0, axis=1).astype(jnp.int32)
        )
        batch_size = prompt.shape[0]
        beams = decode.beam_size if decode.method == "beam" else 1
        if beams > 1:
            prompt, lengths = decoding.repeat_for_beams((prompt, lengths), beams)
        tokens_to_logits, cache = self._prefilled_decoder(
            params, prompt, lengths, max_decode_length
        )
        # The loops feed this id first; its logits are the prompt's, so any id serves.
        ids = dict(start_token_id=self.start_token_id or 0, eos_id=self.eos_id)
        if decode.method == "beam":
            seqs, scores = decoding.beam_search(
                tokens_to_logits,
                cache,
                batch_size,
                beams,
                max_decode_length,
                **decode.beam_options(),
                **ids,
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

    def _prefilled_decoder(
        self, params, prompt: Array, prompt_lengths: Array, max_decode_length: int
    ):
        """(tokens_to_logits, cache) for `decoding`'s loops, with the prompt already in the
        cache. The loops' first call (fed the start token) returns the prompt's last logits
        without running the model; later calls write one new token each."""
        rows, prompt_len = prompt.shape
        start = [] if self.start_token_id is None else [self.start_token_id]
        width = prompt_len + len(start)  # start token (if any) + prompt
        total = width + max_decode_length
        lengths = prompt_lengths + len(start)
        pad = width - lengths  # left padding per row
        slots = jnp.arange(width)[None, :]
        with_start = jnp.concatenate(
            [jnp.full((rows, len(start)), start[0] if start else 0, jnp.int32), prompt], axis=1
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
