"""Autoregressive decoding on a key/value cache.

The decoding loop only knows a `tokens_to_logits(token_ids, cache) -> (logits, cache)` function,
so every model family with a cached decoder shares it.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

Array = jax.Array
Cache = Any
TokensToLogits = Callable[[Array, Cache], tuple[Array, Cache]]


def greedy_decode(tokens_to_logits: TokensToLogits, cache: Cache, batch_size: int,
                  max_decode_length: int, start_token_id: int = 0,
                  eos_id: int | None = 1) -> tuple[Array, Array]:
    """Argmax decoding, one position per step, stopping when every row has emitted EOS.

    Returns (tokens, log_probs): tokens (batch, max_decode_length) with 0 after each row's EOS,
    and the summed log-probability of each row's tokens up to and including its EOS.
    """

    def cond(state):
        step, _, _, _, finished, _ = state
        return jnp.logical_and(step < max_decode_length, jnp.logical_not(jnp.all(finished)))

    def body(state):
        step, cur, sequences, cache, finished, total = state
        logits, cache = tokens_to_logits(cur, cache)
        log_probs = jax.nn.log_softmax(logits[:, -1].astype(jnp.float32), axis=-1)
        nxt = jnp.argmax(log_probs, axis=-1).astype(jnp.int32)
        chosen = jnp.take_along_axis(log_probs, nxt[:, None], axis=-1)[:, 0]
        total = total + jnp.where(finished, 0.0, chosen)
        nxt = jnp.where(finished, 0, nxt)
        sequences = jax.lax.dynamic_update_slice(sequences, nxt[:, None], (0, step))
        if eos_id is not None:
            finished = jnp.logical_or(finished, nxt == eos_id)
        return step + 1, nxt[:, None], sequences, cache, finished, total

    init = (
        jnp.array(0, jnp.int32),
        jnp.full((batch_size, 1), start_token_id, jnp.int32),
        jnp.zeros((batch_size, max_decode_length), jnp.int32),
        cache,
        jnp.zeros((batch_size,), bool),
        jnp.zeros((batch_size,), jnp.float32),
    )
    _, _, sequences, _, _, total = jax.lax.while_loop(cond, body, init)
    return sequences, total
