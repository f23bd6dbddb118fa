"""Transformer building blocks shared by every model family.

Each parameter is created through `nn.with_logical_partitioning`, so it carries logical axis
names ('embed', 'mlp', 'heads', 'kv', 'vocab', 'relpos_buckets') that the partitioning rules map
onto a device mesh. By default the blocks follow Mesh-TensorFlow T5 (the paper's code): no dense
biases, no 1/sqrt(d_kv) attention scaling (it is folded into the query initialisation), and
fan-in normal initialisation. BERT and GPT switch on exactly what their papers differ in:
biases (`use_bias`), explicit 1/sqrt(d_kv) logit scaling (`scale_logits`) and their
initialisers.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from t5x_like import products, reductions
from t5x_like.models import base, flash_attention

Array = jax.Array
Initializer = Callable[..., Array]
DType = jnp.dtype

# Large negative number used instead of -inf so that fully masked rows stay finite.
NEG_INF = -1e10


def fan_in_normal(scale: float = 1.0) -> Initializer:
    """Normal init with variance scale / fan_in, fan_in = product of the input axes.

    Mesh-TF T5 initialises every kernel this way; `scale` lets the query projection fold in the
    1/d_kv factor that other Transformers apply to the attention logits.
    """

    def init(key: Array, shape: Sequence[int], dtype: DType, in_axes: int = 1) -> Array:
        fan_in = int(np.prod(shape[:in_axes]))
        return jax.random.normal(key, shape, dtype) * np.sqrt(scale / fan_in).astype(dtype)

    return init


def normal(stddev: float) -> Initializer:
    """N(0, stddev^2) whatever the shape (BERT and GPT initialise every kernel this way)."""

    def init(key: Array, shape: Sequence[int], dtype: DType, in_axes: int = 1) -> Array:
        del in_axes
        return jax.random.normal(key, shape, dtype) * jnp.asarray(stddev, dtype)

    return init


def _param(
    module: nn.Module,
    name: str,
    init: Initializer,
    shape: Sequence[int],
    axes: Sequence[str],
    dtype: DType = jnp.float32,
) -> Array:
    """Declare a parameter tagged with logical axis names."""
    return module.param(name, nn.with_logical_partitioning(init, tuple(axes)), tuple(shape), dtype)


class RMSNorm(nn.Module):
    """T5 layer norm: scale only, no bias, no mean subtraction, statistics in float32."""

    epsilon: float = 1e-6
    dtype: DType = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        x32 = x.astype(jnp.float32)
        variance = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
        y = x32 * jax.lax.rsqrt(variance + self.epsilon)
        scale = _param(self, "scale", nn.initializers.ones, (x.shape[-1],), ("embed",))
        return (y * scale).astype(self.dtype)


def layer_norm(epsilon: float, dtype: DType, name: str) -> nn.LayerNorm:
    """BERT's and GPT's LayerNorm: scale and bias (statistics in float32), tagged 'embed'."""
    return nn.LayerNorm(
        epsilon=epsilon,
        dtype=dtype,
        param_dtype=jnp.float32,
        name=name,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
    )


# Rematerialisation: what a layer keeps from its forward pass for the backward pass; the rest is
# recomputed. 'full' keeps only the layer's input (least memory, ~one extra forward); 'dots'
# keeps every matmul output; 'dots_no_batch' keeps the weight matmuls but recomputes the
# attention scores and their softmax (the part that grows with length squared);
# 'save_qkv_proj' keeps only the query/key/value projections.
REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "save_qkv_proj": jax.checkpoint_policies.save_only_these_names(
        "query_proj", "key_proj", "value_proj"
    ),
}


def check_remat_policy(policy: str) -> None:
    if policy not in REMAT_POLICIES:
        raise ValueError(f"remat_policy={policy!r}; choose one of {sorted(REMAT_POLICIES)}.")


# 'xla': the attention written out (einsum, bias, mask, softmax, dropout): the reference.
# 'dot_product_attention': `jax.nn.dot_product_attention`, which picks cuDNN's fused flash
# attention on NVIDIA GPUs (relative bias and masks included) and XLA elsewhere. Attention
# dropout is not fused: with dropout active a layer runs the reference path.
# 'flash': the Pallas kernel of `flash_attention`, T5's relative bias computed inside it (T5
# only; decoding with a cache and attention dropout run the reference path).
ATTENTION_IMPLEMENTATIONS = ("xla", "dot_product_attention", "flash")


def check_attention_implementation(name: str, flash: bool = False) -> None:
    """`flash`: whether the model family builds the structured masks the kernel takes."""
    if name not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(
            f"attention_implementation={name!r}; choose one of {ATTENTION_IMPLEMENTATIONS}."
        )
    if name == "flash" and not flash:
        raise ValueError(
            "attention_implementation='flash' is implemented for T5 only; use "
            "'dot_product_attention' (cuDNN on GPU) or 'xla' for this model."
        )


def remat(layer: type[nn.Module], policy: str, static_argnums: tuple[int, ...]) -> type[nn.Module]:
    """`layer` with rematerialisation under `policy` (a name in REMAT_POLICIES; 'none' returns
    it unchanged). Parameter names and values do not change, only what the backward pass
    keeps. `static_argnums` count `self` as 0 and every call must pass those arguments
    positionally (flax's lifted jax.checkpoint)."""
    check_remat_policy(policy)
    if policy == "none":
        return layer
    return nn.remat(layer, policy=REMAT_POLICIES[policy], static_argnums=static_argnums)


# The module name of a scanned stack: its parameters (and cache) carry a leading layer axis,
# tagged with this logical axis name, where an unscanned stack has `layers_0`, `layers_1`, ...
SCANNED_STACK = "layers"


def scanned_stack(
    layer: type[nn.Module],
    num_layers: int,
    remat_policy: str,
    static_argnums: tuple[int, ...],
    num_args: int,
) -> type[nn.Module]:
    """`layer` repeated `num_layers` times as one `nn.scan`: traced and compiled once whatever
    the depth, so compile time stays flat as layers are added.

    `layer` is called `(x, *args)` with `num_args` further arguments, the same for every
    layer (masks, the relative bias, flags); each layer's output is the next one's `x`.
    Parameters and any key/value cache are stacked on a leading axis (logical name 'layers',
    never sharded); `checkpoints.scan_layout` converts them to and from the per-layer layout.
    Rematerialisation (`remat_policy`, `static_argnums` as for `remat`) applies per layer.
    """

    class Step(layer):
        def __call__(self, x, *args):  # the (carry, output) form nn.scan expects
            return super().__call__(x, *args), None

    Step.__name__ = Step.__qualname__ = f"Scanned{layer.__name__}"
    return nn.scan(
        remat(Step, remat_policy, static_argnums),
        variable_axes={"params": 0, "cache": 0},
        split_rngs={"params": True, "dropout": True},
        in_axes=(nn.broadcast,) * num_args,
        length=num_layers,
        metadata_params={nn.PARTITION_NAME: SCANNED_STACK},
    )


class HiddenSizeConfig(base.ModelConfig):
    """A config sized by `hidden_size` split over `num_heads` (BERT, GPT)."""

    hidden_size: int
    num_heads: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


class Embed(nn.Module):
    """Token embedding table that can also act as the (tied) output projection."""

    num_embeddings: int
    features: int
    dtype: DType = jnp.float32
    embedding_init: Initializer = nn.initializers.normal(stddev=1.0)

    def setup(self) -> None:
        self.embedding = _param(
            self,
            "embedding",
            self.embedding_init,
            (self.num_embeddings, self.features),
            ("vocab", "embed"),
        )

    def __call__(self, token_ids: Array) -> Array:
        return jnp.take(self.embedding, token_ids, axis=0).astype(self.dtype)

    def attend(self, query: Array) -> Array:
        """Logits against every embedding row: query @ embedding^T, with the rows flattened
        as in `project`. Written against the table itself, not its transpose: XLA would fold
        a transpose of the table's gradient back into the product that computes it, the form
        its CPU backend leaves to a slow kernel (`products`)."""
        rows = query.reshape(-1, query.shape[-1])
        logits = products.einsum_with_cpu_gradients("ni,vi->nv")(
            rows, self.embedding.astype(self.dtype)
        )
        return logits.reshape(*query.shape[:-1], self.num_embeddings)


def project(x: Array, kernel: Array, n_in: int) -> Array:
    """Contract the last `n_in` dims of `x` with the first `n_in` of `kernel`.

    Written as one 2-D matmul (leading dims and the kernel's in/out dims flattened) rather
    than an N-D `dot_general`: same values, but XLA's CPU backend then routes the forward and
    both gradients through its fast matmul kernels instead of transposing the output gradient
    and falling back to a slow generic dot (the standard benchmark step: ~2.8 s -> ~2.4 s).
    Flattening the batch and length dims into one is what matters (the weight gradient then
    contracts a single dim); flattening only the kernel gains nothing. The reshapes are free
    (bitcasts). Under a mesh the rows must split evenly over the data-parallel devices (XLA
    miscompiled gradients of this form on padded shards; `trainer` refuses such micro-batches).
    The weight gradient xᵀ·dy is laid out by `products` for the CPU backend's fast kernel.
    """
    lead, in_shape, out_shape = x.shape[:-n_in], kernel.shape[:n_in], kernel.shape[n_in:]
    rows = x.reshape(-1, math.prod(in_shape))
    y = products.einsum_with_cpu_gradients("ni,io->no")(rows, kernel.reshape(rows.shape[1], -1))
    return y.reshape(*lead, *out_shape)


class Dense(nn.Module):
    """Projection from the last `len(in_axes)` dims to `features` dims; bias-free unless
    `use_bias` (T5 has none, BERT and GPT have them)."""

    features: Sequence[int]
    in_axes: Sequence[str]
    out_axes: Sequence[str]
    kernel_init: Initializer = fan_in_normal()
    dtype: DType = jnp.float32
    use_bias: bool = False

    @nn.compact
    def __call__(self, x: Array) -> Array:
        n_in = len(self.in_axes)
        in_shape = x.shape[-n_in:]
        init = functools.partial(self.kernel_init, in_axes=n_in)
        kernel = _param(
            self, "kernel", init, (*in_shape, *self.features), (*self.in_axes, *self.out_axes)
        )
        y = project(x.astype(self.dtype), kernel.astype(self.dtype), n_in)
        if self.use_bias:
            bias = _param(
                self, "bias", nn.initializers.zeros, tuple(self.features), tuple(self.out_axes)
            )
            y = add_shared_bias(y, bias.astype(self.dtype))  # its gradient sums as a dot
        return y


class MlpBlock(nn.Module):
    """Feed-forward block: ReLU (T5 v1.0) or gated GELU (T5 v1.1), no biases.

    With several activations, each gets its own input projection (`wi_0`, `wi_1`, ...) and the
    results are multiplied together: ('gelu', 'linear') is GEGLU.
    """

    mlp_dim: int
    activations: Sequence[str] = ("relu",)
    dropout_rate: float = 0.0
    dtype: DType = jnp.float32
    use_bias: bool = False
    kernel_init: Initializer = fan_in_normal()
    output_kernel_init: Initializer | None = None  # `wo`'s own init (GPT-2's residual scaling)

    @nn.compact
    def __call__(self, x: Array, deterministic: bool = True) -> Array:
        emb_dim = x.shape[-1]
        dense = functools.partial(
            Dense, dtype=self.dtype, use_bias=self.use_bias, kernel_init=self.kernel_init
        )
        hidden = None
        for i, act in enumerate(self.activations):
            name = "wi" if len(self.activations) == 1 else f"wi_{i}"
            h = dense((self.mlp_dim,), ("embed",), ("mlp",), name=name)(x)
            h = _activation(act)(h)
            hidden = h if hidden is None else hidden * h
        hidden = Dropout(self.dropout_rate, broadcast_dims=(-2,))(
            hidden, deterministic=deterministic
        )
        return dense(
            (emb_dim,),
            ("mlp",),
            ("embed",),
            name="wo",
            kernel_init=self.output_kernel_init or self.kernel_init,
        )(hidden)


def _activation(name: str) -> Callable[[Array], Array]:
    table = {
        "relu": nn.relu,
        "gelu": functools.partial(nn.gelu, approximate=True),  # T5 v1.1 / HF "gelu_new"
        "gelu_exact": functools.partial(nn.gelu, approximate=False),
        "linear": lambda x: x,
    }
    if name not in table:
        raise ValueError(f"Unknown activation {name!r}; choose one of {sorted(table)}.")
    return table[name]


def relative_position_bucket(
    relative_position: np.ndarray,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> np.ndarray:
    """Map key_position - query_position to a bucket index, as Mesh-TF T5 does.

    Half the buckets are exact offsets; the rest are logarithmically spaced up to
    `max_distance`, beyond which every offset shares the last bucket. Bidirectional attention
    spends half the buckets on keys after the query. A tiny epsilon inside the log keeps exact
    powers on their own bucket despite float rounding (the reference does the same).
    """
    n = -np.asarray(relative_position, dtype=np.int64)
    ret = np.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        ret += (n < 0).astype(np.int64) * num_buckets
        n = np.abs(n)
    else:
        n = np.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    with np.errstate(divide="ignore", invalid="ignore"):  # log(0) -> -inf, never selected
        val_if_large = max_exact + (
            np.log(n.astype(np.float32) / max_exact + np.finfo(np.float32).eps)
            / np.log(max_distance / max_exact)
            * (num_buckets - max_exact)
        ).astype(np.int64)
    val_if_large = np.minimum(val_if_large, num_buckets - 1)
    return ret + np.where(is_small, n, val_if_large)


@jax.custom_vjp
def gather_buckets(table: Array, buckets: Array) -> Array:
    """`table[:, buckets]`: (heads, num_buckets) -> (heads, q, k). Same values and gradient as
    `jnp.take`; the gradient is a matrix product with the one-hot buckets over (q, k) in the
    natural layout. A gather's own backward (a scatter-add) made XLA's CPU backend transpose
    the (heads, q, k) gradient inside the fusion that sums it over the batch and the layers, a
    cache-hostile loop that took ~8 % of the benchmark step."""
    return jnp.take(table, buckets, axis=1)


def _gather_buckets_fwd(table: Array, buckets: Array) -> tuple[Array, tuple[Array, Array]]:
    return jnp.take(table, buckets, axis=1), (table, buckets)


def _gather_buckets_bwd(saved: tuple[Array, Array], grad: Array) -> tuple[Array, None]:
    table, buckets = saved
    heads, num_buckets = table.shape
    one_hot = jax.nn.one_hot(buckets.reshape(-1), num_buckets, dtype=grad.dtype)  # (q*k, n)
    # One 2-D product over the flattened (q, k) (an N-D contraction let XLA pick a transposed
    # layout for it). HIGHEST: float32 also where matmuls default to bfloat16 passes or TF32.
    table_grad = jnp.matmul(grad.reshape(heads, -1), one_hot, precision=jax.lax.Precision.HIGHEST)
    return table_grad.astype(table.dtype), None


gather_buckets.defvjp(_gather_buckets_fwd, _gather_buckets_bwd)


class RelativePositionBias(nn.Module):
    """One learned scalar per (head, bucket), added to the attention logits.

    Computed once per stack and shared by all of that stack's layers.
    """

    num_buckets: int
    max_distance: int
    num_heads: int
    bidirectional: bool
    dtype: DType = jnp.float32

    @nn.compact
    def __call__(
        self, q_len: int, k_len: int, structured: bool = False
    ) -> Array | flash_attention.FlashBias:
        """(1, heads, q, k), or with `structured` the table and bucketing for the flash
        kernel to expand itself."""
        table = _param(
            self,
            "rel_embedding",
            fan_in_normal(),
            (self.num_heads, self.num_buckets),
            ("heads", "relpos_buckets"),
        )
        if structured:
            spec = flash_attention.RelativeBias(
                self.num_buckets, self.max_distance, self.bidirectional
            )
            return flash_attention.FlashBias(table.astype(jnp.float32), spec)
        context = np.arange(q_len)[:, None]
        memory = np.arange(k_len)[None, :]
        buckets = relative_position_bucket(
            memory - context, self.bidirectional, self.num_buckets, self.max_distance
        )
        bias = gather_buckets(table, jnp.asarray(buckets, jnp.int32))  # (heads, q, k)
        return bias[None].astype(self.dtype)  # (1, heads, q, k)


@jax.custom_vjp
def add_shared_bias(logits: Array, bias: Array) -> Array:
    """`logits + bias` for a bias broadcast over leading axes (T5's relative position bias,
    one per stack, over the batch; BERT's masked-LM output bias over batch and predictions;
    every `Dense` bias over all rows).
    Same values and gradients as the plain sum. The backward pass materialises the logits'
    gradient before summing it, because XLA's CPU backend otherwise fuses that sum with the
    softmax backward and recomputes it in a slow transposed loop (about 6 % of the benchmark
    step), and sums over the leading axes as a matrix product on CPU
    (`reductions.sum_to_shape`: XLA's own loop for that shape took ~400 ms of a 3 s step)."""
    return logits + bias


def _add_shared_bias_fwd(logits: Array, bias: Array) -> tuple[Array, tuple[Array, Array]]:
    # The bias only for its shape and dtype (no copy), an empty array for the logits' dtype
    # (bfloat16 logits plus a float32 bias give float32, whose gradient goes back as bfloat16).
    return logits + bias, (bias, jnp.zeros((0,), logits.dtype))


def _add_shared_bias_bwd(saved: tuple[Array, Array], grad: Array) -> tuple[Array, Array]:
    bias, logits_dtype = saved
    grad = jax.lax.optimization_barrier(grad)
    bias_grad = reductions.sum_to_shape(grad, bias.shape).astype(bias.dtype)
    return grad.astype(logits_dtype.dtype), jax.lax.optimization_barrier(bias_grad)


add_shared_bias.defvjp(_add_shared_bias_fwd, _add_shared_bias_bwd)


def _keep_mask(module: nn.Module, rate: float, shape: Sequence[int]) -> Array:
    """The keep mask nn.Dropout(rate) draws in `module` for a mask of `shape`: same stream,
    same numbers, as booleans."""
    return jax.random.bernoulli(module.make_rng("dropout"), 1.0 - rate, tuple(shape))


class DropoutKeep(nn.Module):
    """The keep mask nn.Dropout(rate) would draw for an input of `shape`."""

    rate: float

    def __call__(self, shape: tuple[int, ...]) -> Array:
        return _keep_mask(self, self.rate, shape)


class Dropout(nn.Module):
    """nn.Dropout — same random stream (same name, `Dropout_<n>`, when auto-named), same mask,
    same values and gradients — whose backward pass keeps the mask as bits. Differentiated as
    nn.Dropout writes it, XLA keeps the random generator's raw output for the backward pass
    (two uint32 words per element, to redo the keep comparison there): 8 bytes per element of
    every hidden state BERT and GPT drop out, ~300 MiB of a BERT-base step at 4 x 512 tokens.
    Here the mask is kept packed, 8 elements a byte (`pack_bits`). A reduction, the packing
    is not recomputed inside the backward pass's fusions as a comparison would be."""

    rate: float
    broadcast_dims: Sequence[int] = ()
    deterministic: bool | None = None

    @nn.compact
    def __call__(self, inputs: Array, deterministic: bool | None = None) -> Array:
        deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
        if self.rate == 0.0 or deterministic:
            return inputs
        if self.rate == 1.0:  # as nn.Dropout: no division by a zero keep probability
            return jnp.zeros_like(inputs)
        broadcast = {d % inputs.ndim for d in self.broadcast_dims}
        keep = _keep_mask(
            self, self.rate, [1 if d in broadcast else n for d, n in enumerate(inputs.shape)]
        )
        if inputs.ndim - 1 in broadcast:  # one mask bit per row: too few to be worth packing
            return _drop(inputs, jnp.broadcast_to(keep, inputs.shape), self.rate)
        return dropped(inputs, keep, self.rate)


def pack_bits(mask: Array) -> Array:
    """A boolean array as uint8, 8 elements of its last axis a byte (the axis padded to a
    multiple of 8 with False)."""
    pad = -mask.shape[-1] % 8
    mask = jnp.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, pad)])
    bits = mask.reshape(*mask.shape[:-1], mask.shape[-1] // 8, 8).astype(jnp.uint8)
    return jnp.sum(bits << jnp.arange(8, dtype=jnp.uint8), axis=-1, dtype=jnp.uint8)


def unpack_bits(packed: Array, length: int) -> Array:
    """The boolean array `pack_bits` packed, whose last axis had `length` elements."""
    bits = (packed[..., None] >> jnp.arange(8, dtype=jnp.uint8)) & 1
    return bits.reshape(*packed.shape[:-1], -1)[..., :length].astype(bool)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def dropped(inputs: Array, keep: Array, rate: float) -> Array:
    """nn.Dropout's arithmetic (`_drop`) with `keep` broadcast over the inputs' leading axes
    (its last axis is the inputs'); the backward pass keeps `keep` packed to bits."""
    return _drop(inputs, jnp.broadcast_to(keep, inputs.shape), rate)


def _dropped_fwd(inputs, keep, rate):
    return dropped(inputs, keep, rate), pack_bits(keep)


def _dropped_bwd(rate, packed, grad):
    keep = jnp.broadcast_to(unpack_bits(packed, grad.shape[-1]), grad.shape)
    return _drop(grad, keep, rate), None


dropped.defvjp(_dropped_fwd, _dropped_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def dropped_product(
    attend: Callable[[Array, Array], Array], rate: float, weights: Array, keep: Array, value: Array
) -> Array:
    """attend(dropout(weights), value) with nn.Dropout's arithmetic, whose backward pass reads
    the mask off the dropped weights (nonzero where kept) instead of keeping the mask.
    Differentiated as written, XLA keeps the random generator's raw bits for the backward
    pass (two uint32 arrays per weight, 8 bytes, to redo the comparison there) beside the
    dropped weights: 96 MB a layer at BERT-base size with 4 x 512 tokens. The dropped weights
    alone are what the value gradient needs anyway. Where a weight is zero but was kept (a
    masked position, an exp underflow) the derived mask drops its gradient, which the
    softmax's backward multiplies by that zero weight: the same result."""
    return attend(_drop(weights, keep, rate), value)


def _drop(weights: Array, keep: Array, rate: float) -> Array:
    return jax.lax.select(keep, weights / (1.0 - rate), jnp.zeros_like(weights))


def _dropped_product_fwd(attend, rate, weights, keep, value):
    dropped = _drop(weights, keep, rate)
    return attend(dropped, value), (dropped, value)


def _dropped_product_bwd(attend, rate, saved, grad):
    dropped, value = saved
    _, pullback = jax.vjp(attend, dropped, value)
    d_dropped, d_value = pullback(grad)
    d_weights = jnp.where(dropped != 0, d_dropped / (1.0 - rate), jnp.zeros_like(d_dropped))
    return d_weights, None, d_value


dropped_product.defvjp(_dropped_product_fwd, _dropped_product_bwd)


def _heads_major(x: Array) -> Array:
    """(batch, length, heads, d) <-> (batch, heads, length, d).

    The attention's products run over (batch, heads) with each head's (length, d) block
    contiguous: with the heads interleaved ((batch, length, heads, d), the projections' own
    layout) XLA CPU's matrix kernel ran the weights-times-values product at 64-85 GFLOP/s
    against 150 for the same product on contiguous blocks (benchmarks/HISTORY.md, part 12).
    The swaps are copies of the (small) queries, keys, values and output, not of the scores.
    """
    return jnp.swapaxes(x, 1, 2)


def _weighted_values(weights: Array, value: Array) -> Array:
    """weights (batch, heads, q, k) times values (batch, heads, k, d), as (batch, q, heads, d)."""
    return _heads_major(products.einsum_with_cpu_gradients("bhqk,bhkd->bhqd")(weights, value))


class MultiHeadAttention(nn.Module):
    """Dot-product attention with an optional autoregressive key/value cache.

    With `decode=True` and an initialised cache, `inputs_q` holds the new positions (one per
    step, or a whole prompt at once); their keys and values are written at `cache_index` and
    they attend to the cached positions so far (a single new position: all up to and including
    itself; several: as the caller's mask says). The cache is created (all zeros) by calling
    the module once with `decode=True` on full-length inputs, which is how `init` is done for
    decoding.
    """

    num_heads: int
    head_dim: int
    dropout_rate: float = 0.0
    dtype: DType = jnp.float32
    float32_logits: bool = True
    use_bias: bool = False
    # None: T5's fan-in init with the 1/sqrt(d_kv) logit scale folded into the query's; an
    # initializer: that init for every projection and an explicit 1/sqrt(d_kv) scale (BERT).
    kernel_init: Initializer | None = None
    output_kernel_init: Initializer | None = None  # `out`'s own init (GPT-2's residual scaling)
    implementation: str = "xla"  # ATTENTION_IMPLEMENTATIONS

    @nn.compact
    def __call__(
        self,
        inputs_q: Array,
        inputs_kv: Array,
        mask: Array | None = None,
        bias: Array | None = None,
        deterministic: bool = True,
        decode: bool = False,
    ) -> Array:
        explicit_scale = self.kernel_init is not None
        init = self.kernel_init or fan_in_normal()
        proj = functools.partial(
            Dense,
            features=(self.num_heads, self.head_dim),
            in_axes=("embed",),
            out_axes=("heads", "kv"),
            dtype=self.dtype,
            use_bias=self.use_bias,
            kernel_init=init,
        )
        emb_dim = inputs_q.shape[-1]
        query_init = init if explicit_scale else fan_in_normal(1.0 / self.head_dim)
        query = checkpoint_name(proj(kernel_init=query_init, name="query")(inputs_q), "query_proj")
        if explicit_scale:
            query = query / jnp.sqrt(jnp.asarray(self.head_dim, query.dtype))
        key = checkpoint_name(proj(name="key")(inputs_kv), "key_proj")
        value = checkpoint_name(proj(name="value")(inputs_kv), "value_proj")

        if decode:
            key, value, mask, bias = self._update_cache(key, value, mask, bias)

        dropout = self.dropout_rate > 0 and not deterministic
        if isinstance(mask, flash_attention.FlashMask):  # the model chose the kernel
            out = flash_attention.attend(query, key, value, mask, bias).astype(self.dtype)
        elif self.implementation == "dot_product_attention" and not dropout:
            # jax's fused attention (cuDNN flash attention on GPU where it applies, XLA
            # elsewhere): T5's relative bias and any mask go in as they are; no 1/sqrt(d)
            # scale (T5 folds it into the query init, BERT/GPT applied it above). The bias
            # keeps the logits' precision, as in the reference.
            bias_dtype = jnp.float32 if self.float32_logits else self.dtype
            out = jax.nn.dot_product_attention(
                query,
                key,
                value,
                bias=None if bias is None else bias.astype(bias_dtype),
                mask=None if mask is None else mask.astype(bool),
                scale=1.0,
            )
        else:
            out = self._reference_attention(query, key, value, mask, bias, deterministic)
        return Dense(
            (emb_dim,),
            ("heads", "kv"),
            ("embed",),
            dtype=self.dtype,
            name="out",
            use_bias=self.use_bias,
            kernel_init=self.output_kernel_init or init,
        )(out)

    def _reference_attention(
        self,
        query: Array,
        key: Array,
        value: Array,
        mask: Array | None,
        bias: Array | None,
        deterministic: bool,
    ) -> Array:
        """softmax(q k^T + bias, masked) v, with dropout on the weights (the papers' form)."""
        logit_dtype = jnp.float32 if self.float32_logits else self.dtype
        query, key, value = (_heads_major(x) for x in (query, key, value))
        logits = products.einsum_with_cpu_gradients("bhqd,bhkd->bhqk")(
            query.astype(logit_dtype), key.astype(logit_dtype)
        )
        if bias is not None:
            logits = add_shared_bias(logits, bias.astype(logit_dtype))
        if mask is not None:
            logits = jnp.where(mask, logits, jnp.asarray(NEG_INF, logit_dtype))
        weights = jax.nn.softmax(logits, axis=-1).astype(self.dtype)
        if deterministic or self.dropout_rate == 0:
            return _weighted_values(weights, value)
        if self.dropout_rate == 1.0:  # as nn.Dropout: zeros (the 1 / keep_prob would be NaN)
            return _weighted_values(jnp.zeros_like(weights), value)
        # Named as the nn.Dropout that stood here was, so the mask draws the same numbers.
        keep = DropoutKeep(self.dropout_rate, name="Dropout_0")(weights.shape)
        return dropped_product(_weighted_values, self.dropout_rate, weights, keep, value)

    def _update_cache(
        self, key: Array, value: Array, mask: Array | None, bias: Array | None
    ) -> tuple[Array, Array, Array | None, Array | None]:
        is_initialized = self.has_variable("cache", "cached_key")
        cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
        cached_value = self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
        cache_index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
        if not is_initialized:
            return key, value, mask, bias
        batch, max_len, _, _ = cached_key.value.shape
        new_positions = key.shape[1]
        index = cache_index.value
        key = jax.lax.dynamic_update_slice(cached_key.value, key, (0, index, 0, 0))
        value = jax.lax.dynamic_update_slice(cached_value.value, value, (0, index, 0, 0))
        cached_key.value, cached_value.value = key, value
        cache_index.value = index + new_positions
        # Keys written so far. One new position sees all of them (causality comes for free);
        # a block of several (a prompt prefill) gets its causal or prefix structure from `mask`.
        visible = (jnp.arange(max_len) < index + new_positions)[None, None, None, :]
        if new_positions > 1 and mask is None:
            raise ValueError(
                "Writing several positions into the cache needs an explicit "
                "(batch, 1, new, max_len) mask."
            )
        mask = visible if mask is None else jnp.logical_and(mask, visible)
        if bias is not None:
            bias = jax.lax.dynamic_slice_in_dim(bias, index, new_positions, axis=-2)
        return key, value, mask, bias
