"""Autoregressive decoding on a key/value cache: greedy, beam search and sampling.

The loops only know a `tokens_to_logits(token_ids, cache) -> (logits, cache)` function, so
every model family with a cached decoder shares them. Everything is a `jax.lax.while_loop`
over fixed shapes, so a whole batch decodes inside one jitted call.

* greedy: the T5 paper's test-time decoding.
* beam search: width K under one of two rules (`BEAM_RULES`). 't5x' (default) is t5x's: the
  length penalty ((5 + length) / 6) ** alpha of Wu et al. (2016), which the T5 paper uses for
  its largest models (K = 4, alpha = 0.6), an exact stop, and live beams returned only when
  too few ended. 'hf' is HuggingFace `generate`'s: the score is the summed log-probability /
  length ** alpha (its `length_penalty`, 1.0 by default there), every beam still running at the
  length limit counts as finished, and the search stops by its `early_stopping` rule (False: a
  heuristic; True: once K hypotheses ended; 'never': an exact bound), so an imported model's
  beams equal HF's.
* sampling: temperature, top-k and top-p (nucleus) filtering, in that order.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import gin
import jax
import jax.numpy as jnp

from t5x_like.models.layers import SCANNED_STACK

Array = jax.Array
Cache = Any
TokensToLogits = Callable[[Array, Cache], tuple[Array, Cache]]
NEG_INF = -1.0e7
METHODS = ("greedy", "beam", "sample")
BEAM_RULES = ("t5x", "hf")
EARLY_STOPPING = (False, True, "never")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """How `predict_batch` decodes; bind e.g. `DecodeConfig.method = 'beam'` in gin."""

    method: str = "greedy"
    beam_size: int = 4
    alpha: float = 0.6
    beam_rule: str = "t5x"
    early_stopping: bool | str = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"DecodeConfig.method={self.method!r}; choose one of {METHODS}.")
        if self.beam_rule not in BEAM_RULES:
            raise ValueError(
                f"DecodeConfig.beam_rule={self.beam_rule!r}; choose one of {BEAM_RULES} "
                "('hf' reproduces HuggingFace generate's beam search, with alpha as its "
                "length_penalty)."
            )
        if not (isinstance(self.early_stopping, bool) or self.early_stopping == "never"):
            raise ValueError(
                f"DecodeConfig.early_stopping={self.early_stopping!r}; choose one of "
                f"{EARLY_STOPPING} (HuggingFace's values; used by beam_rule='hf')."
            )
        if self.beam_size < 1 or self.top_k < 0 or not 0.0 < self.top_p <= 1.0:
            raise ValueError(
                f"Invalid decoding settings {self}: beam_size >= 1, top_k >= 0, 0 < top_p <= 1."
            )
        if self.method == "sample" and self.temperature < 0:
            raise ValueError("DecodeConfig.temperature must be >= 0 (0 = greedy).")

    def beam_options(self) -> dict[str, Any]:
        """`beam_search`'s scoring keywords from this config."""
        return dict(alpha=self.alpha, rule=self.beam_rule, early_stopping=self.early_stopping)


# ----------------------------------------------------------------------- one token per step
ChooseFn = Callable[[Array, Array], Array]  # (log_probs (batch, vocab), rng) -> (batch,)


def _token_by_token(
    tokens_to_logits: TokensToLogits,
    cache: Cache,
    batch_size: int,
    max_decode_length: int,
    choose: ChooseFn,
    rng: Array,
    start_token_id: int,
    eos_id: int | None,
) -> tuple[Array, Array]:
    """Pick one token per row per step with `choose`, stopping when every row has emitted EOS.

    Returns (tokens, log_probs): tokens (batch, max_decode_length) with 0 after each row's EOS,
    and the summed model log-probability of each row's tokens up to and including its EOS.
    """

    def cond(state):
        step, _, _, _, finished, _, _ = state
        return jnp.logical_and(step < max_decode_length, jnp.logical_not(jnp.all(finished)))

    def body(state):
        step, cur, sequences, cache, finished, total, rng = state
        rng, step_rng = jax.random.split(rng)
        logits, cache = tokens_to_logits(cur, cache)
        log_probs = jax.nn.log_softmax(logits[:, -1].astype(jnp.float32), axis=-1)
        nxt = choose(log_probs, step_rng).astype(jnp.int32)
        chosen = jnp.take_along_axis(log_probs, nxt[:, None], axis=-1)[:, 0]
        total = total + jnp.where(finished, 0.0, chosen)
        nxt = jnp.where(finished, 0, nxt)
        sequences = jax.lax.dynamic_update_slice(sequences, nxt[:, None], (0, step))
        if eos_id is not None:
            finished = jnp.logical_or(finished, nxt == eos_id)
        return step + 1, nxt[:, None], sequences, cache, finished, total, rng

    init = (
        jnp.array(0, jnp.int32),
        jnp.full((batch_size, 1), start_token_id, jnp.int32),
        jnp.zeros((batch_size, max_decode_length), jnp.int32),
        cache,
        jnp.zeros((batch_size,), bool),
        jnp.zeros((batch_size,), jnp.float32),
        rng,
    )
    _, _, sequences, _, _, total, _ = jax.lax.while_loop(cond, body, init)
    return sequences, total


def greedy_decode(
    tokens_to_logits: TokensToLogits,
    cache: Cache,
    batch_size: int,
    max_decode_length: int,
    start_token_id: int = 0,
    eos_id: int | None = 1,
) -> tuple[Array, Array]:
    """Argmax decoding; see `_token_by_token` for the outputs."""
    return _token_by_token(
        tokens_to_logits,
        cache,
        batch_size,
        max_decode_length,
        lambda log_probs, _: jnp.argmax(log_probs, axis=-1),
        jax.random.key(0),
        start_token_id,
        eos_id,
    )


def filter_logits(logits: Array, top_k: int = 0, top_p: float = 1.0) -> Array:
    """Keep the k most likely tokens (0 = all), then the smallest set whose probability
    reaches top_p (the most likely token always stays); the rest get NEG_INF."""
    if top_k:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, NEG_INF, logits)
    if top_p < 1.0:
        sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        # Mass of the tokens strictly more likely than each one: keep while it is < top_p.
        before = jnp.cumsum(probs, axis=-1) - probs
        keep = before < top_p
        threshold = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < threshold, NEG_INF, logits)
    return logits


def sample_decode(
    tokens_to_logits: TokensToLogits,
    cache: Cache,
    batch_size: int,
    max_decode_length: int,
    rng: Array,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    start_token_id: int = 0,
    eos_id: int | None = 1,
) -> tuple[Array, Array]:
    """Ancestral sampling from softmax(filtered logits / temperature); temperature 0 is
    greedy. Scores are the model's own (unfiltered, temperature 1) log-probabilities."""

    def choose(log_probs, step_rng):
        if temperature == 0.0:
            return jnp.argmax(log_probs, axis=-1)
        filtered = filter_logits(log_probs / temperature, top_k, top_p)
        return jax.random.categorical(step_rng, filtered, axis=-1)

    return _token_by_token(
        tokens_to_logits, cache, batch_size, max_decode_length, choose, rng, start_token_id, eos_id
    )


# ----------------------------------------------------------------------- beam search
def length_penalty(length: Array | int, alpha: float, rule: str = "t5x") -> Array:
    """What a beam's summed log-probability is divided by: Wu et al. (2016)'s
    ((5 + length) / 6) ** alpha under 't5x', HuggingFace's length ** alpha under 'hf'; alpha 0
    ranks by log-probability under both. `length` counts generated tokens, EOS included."""
    length = jnp.asarray(length, jnp.float32)
    return (length if rule == "hf" else (5.0 + length) / 6.0) ** alpha


def repeat_for_beams(tree: Any, beam_size: int) -> Any:
    """(batch, ...) -> (batch * beam_size, ...), each row repeated beam_size times in place;
    scalars (e.g. a cache index) are shared."""
    return jax.tree_util.tree_map(
        lambda x: jnp.repeat(x, beam_size, axis=0) if jnp.ndim(x) else x, tree
    )


def _gather_beams(x: Array, indices: Array) -> Array:
    """x (batch, beam, ...) -> (batch, n, ...): for each row, beams `indices` (batch, n)."""
    return jnp.take_along_axis(x, indices.reshape(indices.shape + (1,) * (x.ndim - 2)), axis=1)


def _gather_cache(cache: Cache, indices: Array, batch_size: int, beam_size: int) -> Cache:
    """The same reordering for cache leaves laid out as (batch * beam, ...), or as
    (layers, batch * beam, ...) inside a scanned stack; leaves without that axis (cache
    indices) are shared."""

    rows = (jnp.arange(batch_size)[:, None] * beam_size + indices).reshape(-1)

    def gather(path, x):
        axis = 1 if any(getattr(k, "key", None) == SCANNED_STACK for k in path) else 0
        return x if jnp.ndim(x) <= axis else jnp.take(x, rows, axis=axis)

    return jax.tree_util.tree_map_with_path(gather, cache)


def beam_search(
    tokens_to_logits: TokensToLogits,
    cache: Cache,
    batch_size: int,
    beam_size: int,
    max_decode_length: int,
    alpha: float = 0.6,
    start_token_id: int = 0,
    eos_id: int | None = 1,
    rule: str = "t5x",
    early_stopping: bool | str = False,
) -> tuple[Array, Array]:
    """Beam search over a cache laid out as (batch * beam_size, ...) (`repeat_for_beams`).

    Each step extends every live beam by every token and keeps the 2K best extensions: those
    that end (in EOS, and under 'hf' also at the length limit) and rank within the top K become
    finished hypotheses, scored log-probability / `length_penalty(length, alpha, rule)`; the K
    best others stay live. When the search stops:
      't5x': when no live beam can still beat the worst kept finished hypothesis (its score
        bounded with the penalty at max_decode_length), or at max_decode_length;
      'hf': as HuggingFace's `generate(num_beams=K, length_penalty=alpha, early_stopping=...)`:
        per row, once all K slots hold finished hypotheses and the best live beam's score at
        its current length ('never' with alpha > 0: at max_decode_length) is no better than
        the worst of them, the row takes no more (it does not reopen); True also stops a row
        as soon as K have ended. The whole search stops when no row is open, or (True) every
        row is full, or at max_decode_length.

    Returns (sequences, scores): (batch, beam_size, max_decode_length) with 0 after EOS:
    finished hypotheses best first, then (if fewer than K finished, 't5x' only) the best live
    ones, scored with the penalty at max_decode_length.
    """
    if rule not in BEAM_RULES:
        raise ValueError(f"beam_search rule={rule!r}; choose one of {BEAM_RULES}.")
    k = beam_size
    stop_when_full = rule == "hf" and early_stopping is True
    # HF's bound on a live beam's best score: at the length limit for 'never' with a penalty
    # that favours length, else at its current length (the False / True heuristic).
    bound_at_limit = rule == "hf" and early_stopping == "never" and alpha > 0

    def step_log_probs(seqs, step, cache):
        tokens = jax.lax.dynamic_slice_in_dim(seqs, step, 1, axis=2).reshape(batch_size * k, 1)
        logits, cache = tokens_to_logits(tokens, cache)
        log_probs = jax.nn.log_softmax(logits[:, -1].astype(jnp.float32), axis=-1)
        return log_probs.reshape(batch_size, k, -1), cache

    def full(fin_flags):
        return jnp.all(fin_flags, axis=1)

    def still_open(open_rows, step, alive_lp, fin_scores, fin_flags):
        """HF's rule, after `step` generated tokens: can a live beam still improve the row?"""
        length = max_decode_length if bound_at_limit else step
        best_possible = alive_lp[:, 0] / length_penalty(length, alpha, rule)
        return open_rows & (~full(fin_flags) | (best_possible > jnp.min(fin_scores, axis=1)))

    def cond(state):
        step, _, alive_lp, _, fin_scores, fin_flags, open_rows, _ = state
        if rule == "hf":
            going = jnp.any(open_rows) & ~(stop_when_full & jnp.all(fin_flags))
        else:
            best_possible = alive_lp[:, 0] / length_penalty(max_decode_length, alpha)
            worst_finished = jnp.min(jnp.where(fin_flags, fin_scores, jnp.inf), axis=1)
            going = ~jnp.all(full(fin_flags) & (best_possible < worst_finished))
        return (step < max_decode_length) & going

    def body(state):
        step, alive_seqs, alive_lp, fin_seqs, fin_scores, fin_flags, open_rows, cache = state
        log_probs, cache = step_log_probs(alive_seqs, step, cache)
        vocab = log_probs.shape[-1]
        candidates = (alive_lp[:, :, None] + log_probs).reshape(batch_size, k * vocab)
        top_lp, top_idx = jax.lax.top_k(candidates, 2 * k)
        beam_idx, token = top_idx // vocab, (top_idx % vocab).astype(jnp.int32)
        top_seqs = _gather_beams(alive_seqs, beam_idx)
        top_seqs = jax.lax.dynamic_update_slice_in_dim(
            top_seqs, token[:, :, None], step + 1, axis=2
        )
        ends = jnp.zeros(token.shape, bool) if eos_id is None else token == eos_id
        if rule == "hf":
            ends = ends | (step + 1 >= max_decode_length)
        # Live: the K best extensions that did not end.
        live_lp = jnp.where(ends, NEG_INF, top_lp)
        live_lp, keep = jax.lax.top_k(live_lp, k)
        alive_seqs = jnp.take_along_axis(top_seqs, keep[:, :, None], axis=1)
        cache = _gather_cache(cache, jnp.take_along_axis(beam_idx, keep, axis=1), batch_size, k)
        # Finished: ended extensions ranked within the top K, merged with the kept ones (under
        # 'hf' only while the row is open and, with early_stopping=True, not yet full).
        takes = open_rows & ~(stop_when_full & full(fin_flags))
        ends = ends & (jnp.arange(2 * k) < k)[None, :] & takes[:, None]
        new_scores = jnp.where(ends, top_lp / length_penalty(step + 1, alpha, rule), NEG_INF)
        all_seqs = jnp.concatenate([fin_seqs, top_seqs], axis=1)
        all_scores = jnp.concatenate([fin_scores, new_scores], axis=1)
        all_flags = jnp.concatenate([fin_flags, ends], axis=1)
        fin_scores, pick = jax.lax.top_k(jnp.where(all_flags, all_scores, NEG_INF - 1.0), k)
        fin_seqs = jnp.take_along_axis(all_seqs, pick[:, :, None], axis=1)
        fin_flags = jnp.take_along_axis(all_flags, pick, axis=1)
        if rule == "hf":
            open_rows = still_open(open_rows, step + 1, live_lp, fin_scores, fin_flags)
        return step + 1, alive_seqs, live_lp, fin_seqs, fin_scores, fin_flags, open_rows, cache

    seqs0 = (
        jnp.zeros((batch_size, k, max_decode_length + 1), jnp.int32).at[:, :, 0].set(start_token_id)
    )
    alive_lp0 = jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1), jnp.float32), (batch_size, 1))
    init = (
        jnp.array(0, jnp.int32),
        seqs0,
        alive_lp0,
        seqs0,
        jnp.full((batch_size, k), NEG_INF, jnp.float32),
        jnp.zeros((batch_size, k), bool),
        jnp.ones((batch_size,), bool),
        cache,
    )
    _, alive_seqs, alive_lp, fin_seqs, fin_scores, fin_flags, _, _ = jax.lax.while_loop(
        cond, body, init
    )
    # Finished hypotheses first (best first), then live ones to fill the K slots.
    alive_scores = alive_lp / length_penalty(max_decode_length, alpha, rule)
    rank = jnp.concatenate(
        [
            jnp.where(fin_flags, fin_scores, 4 * NEG_INF),
            jnp.where(alive_lp > NEG_INF / 2, alive_scores + 2 * NEG_INF, 4 * NEG_INF),
        ],
        axis=1,
    )
    _, order = jax.lax.top_k(rank, k)
    seqs = _gather_beams(jnp.concatenate([fin_seqs, alive_seqs], axis=1), order)[:, :, 1:]
    scores = jnp.take_along_axis(jnp.concatenate([fin_scores, alive_scores], axis=1), order, axis=1)
    # Zero everything after each sequence's first EOS.
    is_eos = jnp.zeros(seqs.shape, bool) if eos_id is None else seqs == eos_id
    after_eos = jnp.cumsum(is_eos, axis=-1) - is_eos > 0
    return jnp.where(after_eos, 0, seqs), scores
