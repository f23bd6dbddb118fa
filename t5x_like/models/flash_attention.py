"""Flash attention as a Pallas kernel, with T5's relative position bias computed inside it.

Peers cannot run T5 under a fused attention kernel: cuDNN's and the Pallas TPU kernels take
the bias as a dense (heads, q, k) array, which is the memory traffic flash attention exists
to avoid, and its gradient (summed over batch and query/key pairs into 32 buckets per head)
is not something they produce. Here the kernel gets the (heads, buckets) table itself:
each (query block, key block) tile computes its relative positions from the block offsets,
maps them to buckets with Mesh-TF T5's formula and looks the table up, so no bias tensor
exists in memory; the backward kernel sums the logits' gradient per bucket the same way.

Masks are given in a form a tile can evaluate from positions alone: a query attends to a
key when their ids are equal (`q_ids == kv_ids`, which encodes padding and packed
segments; see `ids_from_segments`) and, with `causal`, the key is not after the query.

Forward: one program per (batch, head, query block) walks the key blocks with the online
softmax and writes the output, the running max and the running sum (kept apart, not as a
log-sum-exp: for a query with no visible key, -1e10 + log(n) rounds back to -1e10 in
float32, and the backward pass would then weigh each key 1 instead of 1/n). Backward
(FlashAttention-2's split): one kernel per (batch, head, key block) accumulates dK and dV
over the query blocks, one per (batch, head, query block) accumulates dQ and the per-bucket
bias gradient over the key blocks. Matrix products take the inputs' dtype (bf16 on the
accelerators' matrix units) and accumulate in float32; softmax statistics, bias and
gradients of the logits are float32, and the probabilities are cast to the inputs' dtype
before they multiply V (as the reference attention casts its weights).

On CPU there is no Pallas compiler: the kernels run in Pallas's interpreter (exact, slow), so
the tests check values and gradients there, and lower the kernels for GPU (Triton) and TPU
(Mosaic) from the CPU host, which runs Pallas's lowering rules for those compilers (hence the
layouts: per-query values as (length, 1) columns, key ids as rows, the table as one
(1, buckets) row per head; scalar table reads; no slices of values inside a kernel). Speed
only means something on an accelerator, which no session has had yet
(`benchmarks/gpu_check.sh`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Iterator

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

Array = jax.Array

# The same finite "minus infinity" as the reference attention (`layers.NEG_INF`), so a query
# with no visible key gets the same uniform weights in both.
NEG_INF = -1e10


@dataclasses.dataclass(frozen=True)
class RelativeBias:
    """T5's bucketing of key - query offsets (`layers.relative_position_bucket`)."""

    num_buckets: int = 32
    max_distance: int = 128
    bidirectional: bool = True


def relative_buckets(relative_position: Array, spec: RelativeBias) -> Array:
    """`layers.relative_position_bucket` in jnp (int32), for use inside a kernel tile."""
    n = -relative_position
    num_buckets = spec.num_buckets
    ret = jnp.zeros_like(n)
    if spec.bidirectional:
        num_buckets //= 2
        ret = ret + (n < 0).astype(n.dtype) * num_buckets
        n = jnp.abs(n)
    else:
        n = jnp.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    # log(0) -> -inf for the small offsets, which the `where` never selects: clamp first.
    scaled = jnp.maximum(n, 1).astype(jnp.float32) / max_exact + np.finfo(np.float32).eps
    val_if_large = max_exact + (
        jnp.log(scaled)
        / np.float32(np.log(spec.max_distance / max_exact))
        * (num_buckets - max_exact)
    ).astype(n.dtype)
    val_if_large = jnp.minimum(val_if_large, num_buckets - 1)
    return ret + jnp.where(is_small, n, val_if_large)


def ids_from_segments(valid: Array, segment_ids: Array | None, sentinel: int) -> Array:
    """Mask ids for one side: the segment id (1 when unpacked) where a token is real,
    `sentinel` where it is padding. Give queries and keys different sentinels (-1, -2), so
    that two padding positions never match."""
    ids = jnp.ones(valid.shape, jnp.int32) if segment_ids is None else segment_ids
    return jnp.where(valid, ids.astype(jnp.int32), sentinel)


@dataclasses.dataclass(frozen=True)
class _Static:
    causal: bool
    bias: RelativeBias | None
    block_q: int
    block_k: int
    q_len: int
    kv_len: int
    platform: str  # what the kernels are compiled for: "cpu" (interpreter), "gpu", "tpu"

    @property
    def num_buckets(self) -> int:
        """Columns of the table the kernels get (1, a placeholder, without a bias)."""
        return self.bias.num_buckets if self.bias is not None else 1


def _tile(static: _Static, q_start, k_start, q_ids, kv_ids, table_ref):
    """What a (query block, key block) tile needs besides q k^T: the bias (or None), the
    mask, and the bucket ids (for the bias gradient). `q_ids` is a (block_q, 1) column,
    `kv_ids` a (1, block_k) row; `table_ref` the head's (1, num_buckets) table row."""
    q_pos = q_start + jax.lax.broadcasted_iota(jnp.int32, (static.block_q, static.block_k), 0)
    k_pos = k_start + jax.lax.broadcasted_iota(jnp.int32, (static.block_q, static.block_k), 1)
    mask = q_ids == kv_ids
    if static.causal:
        mask = jnp.logical_and(mask, q_pos >= k_pos)
    bias = buckets = None
    if static.bias is not None:
        shape = (static.block_q, static.block_k)
        far, far_bucket, far_bias = _far_tile(static, q_start, k_start, table_ref)

        def near():
            buckets = relative_buckets(k_pos - q_pos, static.bias)
            bias = jnp.zeros(shape, jnp.float32)
            for b in range(static.bias.num_buckets):  # a table lookup as selects: no gather
                bias = jnp.where(buckets == b, table_ref[0, b], bias)
            return bias, buckets

        def constant():
            return jnp.full(shape, far_bias, jnp.float32), jnp.full(shape, far_bucket, jnp.int32)

        bias, buckets = jax.lax.cond(far, constant, near)
    return bias, mask, buckets


def _far_buckets(spec: RelativeBias) -> tuple[int, int]:
    """The buckets of offsets key - query >= max_distance and <= -max_distance: each side's
    last bucket (unidirectional: every later key is bucket 0)."""
    if spec.bidirectional:
        return spec.num_buckets - 1, spec.num_buckets // 2 - 1
    return 0, spec.num_buckets - 1


def _far_tile(static: _Static, q_start, k_start, table_ref):
    """Whether every key of the tile is at least max_distance after, or before, every query;
    then all its offsets share one bucket, and the tile's bias is one table entry. On long
    sequences most tiles are such (at 2048 tokens in 128-blocks, 210 of 256), and they skip
    the per-element bucketing, the 32-way lookup and, backward, the per-bucket sums: on an
    accelerator that elementwise work costs more than the tile's matrix products."""
    spec = static.bias
    after = k_start - (q_start + static.block_q - 1) >= spec.max_distance
    before = q_start - (k_start + static.block_k - 1) >= spec.max_distance
    bucket_after, bucket_before = _far_buckets(spec)
    # arithmetic, not `where`: Pallas's Triton lowering types a select between two integer
    # literals by its boolean predicate
    bucket = bucket_before + after.astype(jnp.int32) * (bucket_after - bucket_before)
    bias = jnp.where(after, table_ref[0, bucket_after], table_ref[0, bucket_before])
    return jnp.logical_or(after, before), bucket, bias


def _logits(static, q, k, q_start, k_start, q_ids, kv_ids, table_ref):
    s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    bias, mask, buckets = _tile(static, q_start, k_start, q_ids, kv_ids, table_ref)
    if bias is not None:
        s = s + bias
    return jnp.where(mask, s, NEG_INF), mask, buckets


def _num_key_blocks(static: _Static, q_block):
    """Key blocks a query block can see: all, or (causal) up to its last query."""
    total = static.kv_len // static.block_k
    if not static.causal:
        return total
    last = (q_block + 1) * static.block_q - 1
    # lax.div, not //: positions are never negative, and floor division's sign fix-up has no
    # Mosaic lowering without a TPU at hand
    return jnp.minimum(total, jax.lax.div(last, static.block_k) + 1)


def _forward_kernel(
    q_ref, k_ref, v_ref, qid_ref, kvid_ref, table_ref, o_ref, m_ref, l_ref, *, static: _Static
):
    q_block = pl.program_id(2)
    q = q_ref[...]
    q_ids = qid_ref[...]
    q_start = q_block * static.block_q
    bq, bk = static.block_q, static.block_k

    def body(j, carry):
        m, l, acc = carry  # m, l: (block_q, 1) columns
        keys = pl.ds(j * bk, bk)
        k = k_ref[keys, :]
        v = v_ref[keys, :]
        s, _, _ = _logits(static, q, k, q_start, j * bk, q_ids, kvid_ref[:, keys], table_ref)
        m_new = jnp.maximum(m, s.max(axis=-1, keepdims=True))
        p = jnp.exp(s - m_new)
        alpha = jnp.exp(m - m_new)
        l = alpha * l + p.sum(axis=-1, keepdims=True)
        acc = alpha * acc + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return m_new, l, acc

    init = (
        jnp.full((bq, 1), -jnp.inf, jnp.float32),
        jnp.zeros((bq, 1), jnp.float32),
        jnp.zeros((bq, q.shape[-1]), jnp.float32),
    )
    m, l, acc = jax.lax.fori_loop(0, _num_key_blocks(static, q_block), body, init)
    o_ref[...] = (acc / l).astype(o_ref.dtype)
    m_ref[...] = m
    l_ref[...] = l


def _tile_grads(
    static: _Static, q, k, v, do, m, l, delta, q_start, k_start, q_ids, kv_ids, table_ref
):
    """One tile's probabilities p and logit gradient dS = p * (dO V^T - delta), masked; both
    backward kernels need them (and the buckets, for the table gradient)."""
    s, mask, buckets = _logits(static, q, k, q_start, k_start, q_ids, kv_ids, table_ref)
    p = jnp.exp(s - m) / l
    dp = jax.lax.dot_general(do, v, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    return p, jnp.where(mask, p * (dp - delta), 0.0), buckets


def _dkdv_kernel(
    q_ref,
    k_ref,
    v_ref,
    do_ref,
    m_ref,
    l_ref,
    delta_ref,
    qid_ref,
    kvid_ref,
    table_ref,
    dk_ref,
    dv_ref,
    *,
    static: _Static,
):
    k_block = pl.program_id(2)
    bq, bk = static.block_q, static.block_k
    k = k_ref[...]
    v = v_ref[...]
    kv_ids = kvid_ref[...]
    k_start = k_block * bk

    def body(i, carry):
        dk, dv = carry
        rows = pl.ds(i * bq, bq)
        q = q_ref[rows, :]
        do = do_ref[rows, :]
        p, ds, _ = _tile_grads(
            static,
            q,
            k,
            v,
            do,
            m_ref[rows, :],
            l_ref[rows, :],
            delta_ref[rows, :],
            i * bq,
            k_start,
            qid_ref[rows, :],
            kv_ids,
            table_ref,
        )
        dv = dv + jax.lax.dot_general(
            p.astype(do.dtype), do, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32
        )
        dk = dk + jax.lax.dot_general(
            ds.astype(q.dtype), q, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32
        )
        return dk, dv

    # earlier queries cannot see these keys (lax.div: see _num_key_blocks)
    first = jax.lax.div(k_start, bq) if static.causal else 0
    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = jax.lax.fori_loop(first, static.q_len // bq, body, (zeros, zeros))
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _dq_kernel(
    q_ref,
    k_ref,
    v_ref,
    do_ref,
    m_ref,
    l_ref,
    delta_ref,
    qid_ref,
    kvid_ref,
    table_ref,
    dq_ref,
    dtable_ref,
    *,
    static: _Static,
):
    q_block = pl.program_id(2)
    bq, bk = static.block_q, static.block_k
    q = q_ref[...]
    do = do_ref[...]
    m, l, delta, q_ids = m_ref[...], l_ref[...], delta_ref[...], qid_ref[...]
    q_start = q_block * bq
    num_buckets = static.num_buckets

    def body(j, carry):
        dq, dtable = carry
        keys = pl.ds(j * bk, bk)
        k = k_ref[keys, :]
        v = v_ref[keys, :]
        _, ds, buckets = _tile_grads(
            static, q, k, v, do, m, l, delta, q_start, j * bk, q_ids, kvid_ref[:, keys], table_ref
        )
        dq = dq + jnp.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32)
        if buckets is not None:  # the bias gradient: dS summed per bucket
            slot = jax.lax.broadcasted_iota(jnp.int32, (1, num_buckets), 1)
            far, far_bucket, _ = _far_tile(static, q_start, j * bk, table_ref)

            def every_bucket(dtable):
                for b in range(num_buckets):  # a vector update per bucket (no scalar stores)
                    dtable = jnp.where(
                        slot == b, dtable + jnp.sum(jnp.where(buckets == b, ds, 0.0)), dtable
                    )
                return dtable

            def one_bucket(dtable):  # a far tile: all of dS in one bucket
                return jnp.where(slot == far_bucket, dtable + jnp.sum(ds), dtable)

            dtable = jax.lax.cond(far, one_bucket, every_bucket, dtable)
        return dq, dtable

    init = (jnp.zeros(q.shape, jnp.float32), jnp.zeros((1, num_buckets), jnp.float32))
    dq, dtable = jax.lax.fori_loop(0, _num_key_blocks(static, q_block), body, init)
    dq_ref[...] = dq.astype(dq_ref.dtype)
    dtable_ref[...] = dtable


# Layouts the kernels see (chosen so every block's last two dims are whole or tile-aligned,
# as Mosaic requires): per-query values (ids, softmax max/sum, delta) as (length, 1) columns,
# key ids as (1, length) rows, the bias table as (heads, 1, buckets).
def _specs(static: _Static, head_dim: int):
    """Block specs over the (batch, head, block) grid, in the kernels' argument order."""
    bq, bk, lq, lk = static.block_q, static.block_k, static.q_len, static.kv_len
    return dict(
        by_q=pl.BlockSpec((None, None, bq, head_dim), lambda b, h, i: (b, h, i, 0)),
        by_k=pl.BlockSpec((None, None, bk, head_dim), lambda b, h, i: (b, h, i, 0)),
        all_q=pl.BlockSpec((None, None, lq, head_dim), lambda b, h, i: (b, h, 0, 0)),
        all_k=pl.BlockSpec((None, None, lk, head_dim), lambda b, h, i: (b, h, 0, 0)),
        rows_q=pl.BlockSpec((None, None, bq, 1), lambda b, h, i: (b, h, i, 0)),
        all_rows_q=pl.BlockSpec((None, None, lq, 1), lambda b, h, i: (b, h, 0, 0)),
        ids_q=pl.BlockSpec((None, bq, 1), lambda b, h, i: (b, i, 0)),
        all_ids_q=pl.BlockSpec((None, lq, 1), lambda b, h, i: (b, 0, 0)),
        ids_k=pl.BlockSpec((None, 1, bk), lambda b, h, i: (b, 0, i)),
        all_ids_k=pl.BlockSpec((None, 1, lk), lambda b, h, i: (b, 0, 0)),
        table=pl.BlockSpec((None, 1, static.num_buckets), lambda b, h, i: (h, 0, 0)),
    )


def _kernel_layout(q_ids, kv_ids, table):
    return q_ids[:, :, None], kv_ids[:, None, :], table[:, None, :]


def _forward(static: _Static, q, k, v, q_ids, kv_ids, table):
    batch, heads, _, head_dim = q.shape
    sp = _specs(static, head_dim)
    column = jax.ShapeDtypeStruct((batch, heads, static.q_len, 1), jnp.float32)
    return pl.pallas_call(
        functools.partial(_forward_kernel, static=static),
        grid=(batch, heads, static.q_len // static.block_q),
        in_specs=[sp["by_q"], sp["all_k"], sp["all_k"], sp["ids_q"], sp["all_ids_k"], sp["table"]],
        out_specs=[sp["by_q"], sp["rows_q"], sp["rows_q"]],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), column, column],
        **_compile_options(static),
        name="t5_flash_attention_fwd",
    )(q, k, v, *_kernel_layout(q_ids, kv_ids, table))


def _backward(static: _Static, q, k, v, q_ids, kv_ids, table, out, m, l, dout):
    batch, heads, _, head_dim = q.shape
    sp = _specs(static, head_dim)
    delta = jnp.sum(out.astype(jnp.float32) * dout.astype(jnp.float32), axis=-1, keepdims=True)
    args = (q, k, v, dout, m, l, delta, *_kernel_layout(q_ids, kv_ids, table))
    dk, dv = pl.pallas_call(
        functools.partial(_dkdv_kernel, static=static),
        grid=(batch, heads, static.kv_len // static.block_k),
        in_specs=[
            sp["all_q"],
            sp["by_k"],
            sp["by_k"],
            sp["all_q"],
            sp["all_rows_q"],
            sp["all_rows_q"],
            sp["all_rows_q"],
            sp["all_ids_q"],
            sp["ids_k"],
            sp["table"],
        ],
        out_specs=[sp["by_k"], sp["by_k"]],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        **_compile_options(static),
        name="t5_flash_attention_dkdv",
    )(*args)
    num_q_blocks, num_buckets = static.q_len // static.block_q, static.num_buckets
    dq, dtable = pl.pallas_call(
        functools.partial(_dq_kernel, static=static),
        grid=(batch, heads, num_q_blocks),
        in_specs=[
            sp["by_q"],
            sp["all_k"],
            sp["all_k"],
            sp["by_q"],
            sp["rows_q"],
            sp["rows_q"],
            sp["rows_q"],
            sp["ids_q"],
            sp["all_ids_k"],
            sp["table"],
        ],
        out_specs=[
            sp["by_q"],
            pl.BlockSpec((None, None, None, 1, num_buckets), lambda b, h, i: (b, h, i, 0, 0)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct(q.shape, q.dtype),
            jax.ShapeDtypeStruct((batch, heads, num_q_blocks, 1, num_buckets), jnp.float32),
        ],
        **_compile_options(static),
        name="t5_flash_attention_dq",
    )(*args)
    dtable = jnp.sum(dtable, axis=(0, 2, 3)).astype(table.dtype)
    return dq, dk, dv, dtable


_PLATFORMS = ("cpu", "gpu", "cuda", "rocm", "tpu")


def _check_platform(platform: str) -> None:
    if platform not in _PLATFORMS:
        raise ValueError(
            f"flash attention has no compiler for platform {platform!r}; "
            f"use one of {sorted(_PLATFORMS)}."
        )


_TARGET_PLATFORM: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "flash_attention_target_platform", default=None
)


@contextlib.contextmanager
def compile_for(platform: str) -> Iterator[None]:
    """Inside this context, kernels traced without an explicit `platform` (the models' calls)
    are built for `platform` instead of the default backend: with
    `jit(f).trace(...).lower(lowering_platforms=...)`, a CPU host lowers a whole model's step
    for an accelerator."""
    _check_platform(platform)
    token = _TARGET_PLATFORM.set(platform)
    try:
        yield
    finally:
        _TARGET_PLATFORM.reset(token)


def _compile_options(static: _Static) -> dict:
    """`pallas_call` arguments that pick the compiler. GPU names Triton explicitly: this JAX
    lowers GPU kernels to Mosaic GPU by default, whose copies into shared memory are limited to
    256 rows (the key/value blocks here hold the whole sequence). Every grid axis is
    independent (each program writes only its own output blocks), so TPU may split any of them
    over its cores."""
    if static.platform == "cpu":
        return {"interpret": True}
    if static.platform == "tpu":
        from jax.experimental.pallas import tpu as pltpu

        return {
            "compiler_params": pltpu.CompilerParams(
                dimension_semantics=("parallel", "parallel", "parallel")
            )
        }
    from jax.experimental.pallas import triton as pltriton

    return {"compiler_params": pltriton.CompilerParams(num_warps=4, num_stages=2)}


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(static: _Static, q, k, v, q_ids, kv_ids, table):
    return _forward(static, q, k, v, q_ids, kv_ids, table)[0]


def _attention_fwd(static, q, k, v, q_ids, kv_ids, table):
    out, m, l = _forward(static, q, k, v, q_ids, kv_ids, table)
    return out, (q, k, v, q_ids, kv_ids, table, out, m, l)


def _attention_bwd(static, saved, dout):
    q, k, v, q_ids, kv_ids, table, out, m, l = saved
    dq, dk, dv, dtable = _backward(static, q, k, v, q_ids, kv_ids, table, out, m, l, dout)
    if static.bias is None:
        dtable = jnp.zeros_like(table)
    return dq, dk, dv, None, None, dtable


_attention.defvjp(_attention_fwd, _attention_bwd)


def _block(requested: int, length: int) -> int:
    """The tile length: `requested`, or the next power of two of a shorter sequence (Triton
    tiles are powers of two, and its matrix products need at least 16 rows)."""
    return min(requested, max(16, pl.next_power_of_2(length)))


def _pad_to(x: Array, length: int, value: int = 0) -> Array:
    """`x` padded along axis 1 (the sequence) to `length`."""
    pad = length - x.shape[1]
    if not pad:
        return x
    widths = [(0, 0)] * x.ndim
    widths[1] = (0, pad)
    return jnp.pad(x, widths, constant_values=value)


def flash_attention(
    query: Array,
    key: Array,
    value: Array,
    q_ids: Array,
    kv_ids: Array,
    *,
    causal: bool = False,
    relative_table: Array | None = None,
    relative_bias: RelativeBias | None = None,
    block_q: int = 128,
    block_k: int = 128,
    platform: str | None = None,
) -> Array:
    """softmax(q k^T + bias, masked) v for (batch, length, heads, head_dim) inputs, no logit
    scaling (T5 folds it into the query), equal to the reference attention with the dense mask
    `q_ids[:, :, None] == kv_ids[:, None, :]` (and causal) and, given `relative_table`
    (heads, num_buckets) and `relative_bias`, T5's relative position bias, computed in-kernel.

    `platform` (default: JAX's default backend) picks the compiler: 'gpu' (or 'cuda',
    'rocm') Triton, 'tpu' Mosaic, 'cpu' Pallas's interpreter (CPU has no Pallas compiler).
    Naming another platform than the one running lets a CPU host lower the kernels for an
    accelerator (the tests do, to catch what Triton or Mosaic cannot express)."""
    if (relative_table is None) != (relative_bias is None):
        raise ValueError("Give both relative_table and relative_bias, or neither.")
    platform = platform or _TARGET_PLATFORM.get() or jax.default_backend()
    _check_platform(platform)
    batch, q_len, heads, head_dim = query.shape
    kv_len = key.shape[1]
    block_q, block_k = _block(block_q, q_len), _block(block_k, kv_len)
    # Lengths off the tile grid are padded: padded queries match no key (id -3) and are
    # dropped from the output, padded keys match no query (id -4).
    padded_q, padded_kv = -(-q_len // block_q) * block_q, -(-kv_len // block_k) * block_k
    static = _Static(
        causal=causal,
        bias=relative_bias,
        block_q=block_q,
        block_k=block_k,
        q_len=padded_q,
        kv_len=padded_kv,
        platform=platform,
    )
    table = relative_table if relative_table is not None else jnp.zeros((heads, 1), jnp.float32)
    to_heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731  (b, l, h, d) -> (b, h, l, d)
    out = _attention(
        static,
        to_heads_first(_pad_to(query, padded_q)),
        to_heads_first(_pad_to(key, padded_kv)),
        to_heads_first(_pad_to(value, padded_kv)),
        _pad_to(q_ids.astype(jnp.int32), padded_q, -3),
        _pad_to(kv_ids.astype(jnp.int32), padded_kv, -4),
        table,
    )
    return to_heads_first(out)[:, :q_len]


@flax.struct.dataclass
class FlashMask:
    """The attention mask in the form the kernel evaluates per tile (instead of a dense
    (batch, 1, q, k) array): query i sees key j when `q_ids[:, i] == kv_ids[:, j]` and, if
    `causal`, j <= i."""

    q_ids: Array
    kv_ids: Array
    causal: bool = flax.struct.field(pytree_node=False, default=False)


@flax.struct.dataclass
class FlashBias:
    """T5's relative position bias as its (heads, num_buckets) table and bucketing, for the
    kernel to expand tile by tile (instead of a dense (1, heads, q, k) array)."""

    table: Array
    spec: RelativeBias = flax.struct.field(pytree_node=False)


def attend(
    query: Array, key: Array, value: Array, mask: FlashMask, bias: FlashBias | None
) -> Array:
    """`flash_attention` with the mask and bias in their structured forms.

    Under a device mesh (the trainer's `jax.set_mesh`) the kernel runs per shard through
    `shard_map`: a Pallas call has no partitioning rule of its own, and attention is
    independent per example and per head, so each device runs it on its rows and heads (the
    mesh axes the logical 'batch' and 'heads' map to under the rules in context). The bias
    table's gradient, computed per shard, is summed over the batch shards by shard_map's
    transpose."""
    spec = None if bias is None else bias.spec
    # without a bias the kernel ignores the table; a placeholder keeps one call signature
    table = bias.table if bias is not None else jnp.zeros((query.shape[2], 1), jnp.float32)

    def run(q, k, v, q_ids, kv_ids, table):
        return flash_attention(
            q,
            k,
            v,
            q_ids,
            kv_ids,
            causal=mask.causal,
            relative_table=None if spec is None else table,
            relative_bias=spec,
        )

    mesh = jax.sharding.get_abstract_mesh()
    args = (query, key, value, mask.q_ids, mask.kv_ids, table)
    if mesh.empty or mesh.size == 1:
        return run(*args)
    batch_axes, _, head_axes, _ = nn.logical_to_mesh_axes(("batch", "length", "heads", "kv"))
    if not (_splits(query.shape[0], batch_axes, mesh) and _splits(query.shape[2], head_axes, mesh)):
        return run(*args)  # shapes that do not split (the batch-1 trace of `init`): one call
    P = jax.sharding.PartitionSpec
    per_token = P(batch_axes, None, head_axes, None)
    ids = P(batch_axes, None)
    return jax.shard_map(
        run,
        in_specs=(per_token,) * 3 + (ids,) * 2 + (P(head_axes, None),),
        out_specs=per_token,
        check_vma=False,
    )(*args)


def _splits(size: int, axes, mesh) -> bool:
    """Whether a dim of `size` splits evenly over mesh `axes` (None: not split at all)."""
    if axes is None:
        return True
    names = (axes,) if isinstance(axes, str) else tuple(axes)
    return size % int(np.prod([mesh.shape[name] for name in names])) == 0
