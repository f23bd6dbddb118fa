"""The MFU a train step could reach if it were nothing but its matrix products.

    python -m benchmarks.matmul_ceiling [--family t5|decoder_only|bert]
        [--batch 8] [--inputs 512] [--targets 128] [--gin ...] [--reps 7]

MFU counts model FLOPs against the best rate of one large square product (`hardware`). A step
is made of many smaller products whose shapes the model fixes (256-wide projections, 64-wide
attention heads, a 32k vocabulary) and the matmul libraries reach different rates on each.
This benchmark lists every `dot_general` of the trainer's step (from its jaxpr: the forward,
autodiff's backward and the optimizer's; a scanned body counts once per iteration), compiles
each distinct product alone for each of XLA CPU's matmul libraries (`hardware.
CPU_MATMUL_LIBRARIES`; XLA's default elsewhere), times them in turn and adds them up:

  - at the library the step uses (the first: YNNPACK on CPU), the step's matmul time if each
    product ran at its stand-alone rate, and the MFU ceiling that implies: what the step would
    reach if everything else (norms, softmax, activations, the loss, the optimizer update)
    took no time;
  - at the fastest library per product, the ceiling if each product could pick its kernel.

The compiled step itself and the peak probe (`hardware.matmul_timer`) are timed in the same
rounds as the products, so the step's MFU and the ceilings share one machine state, and the
gap between the step and its products (everything that is not a matmul, and products running
slower inside the step than alone) is a measured number. A product alone sees warm caches
and no neighbours, so the ceilings are estimates, not proofs; they say how far a given MFU
target is from what the kernels deliver on this model's shapes.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import platform
import statistics
import time
from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
from jax.extend import core as jax_core

from benchmarks import interleave, results_io, train_throughput
from t5x_like import flops, hardware


@dataclasses.dataclass(frozen=True)
class Product:
    """One `lax.dot_general` as the step calls it: operand shapes and dtypes, dimension
    numbers ((lhs contracting, rhs contracting), (lhs batch, rhs batch)), precision."""

    lhs: tuple[int, ...]
    rhs: tuple[int, ...]
    lhs_dtype: str
    rhs_dtype: str
    dimension_numbers: tuple[
        tuple[tuple[int, ...], tuple[int, ...]], tuple[tuple[int, ...], tuple[int, ...]]
    ]
    precision: Any = None
    preferred_element_type: str | None = None

    @property
    def flops(self) -> int:
        """2 x every (batch, lhs free, rhs free, contracted) combination."""
        (_, rhs_contracting), (_, rhs_batch) = self.dimension_numbers
        rhs_free = [
            n for i, n in enumerate(self.rhs) if i not in rhs_contracting and i not in rhs_batch
        ]
        return 2 * math.prod(self.lhs) * math.prod(rhs_free)

    def describe(self) -> str:
        (lc, rc), (lb, rb) = self.dimension_numbers
        batch = f" batch {lb}x{rb}" if lb else ""
        return f"{list(self.lhs)}.{list(self.rhs)} contract {lc}x{rc}{batch}"

    def call(self) -> tuple[Callable[[jax.Array, jax.Array], jax.Array], tuple[Any, Any]]:
        """(the product as a function, abstract operands to compile it for)."""

        def product(a: jax.Array, b: jax.Array) -> jax.Array:
            return jax.lax.dot_general(
                a,
                b,
                self.dimension_numbers,
                self.precision,
                preferred_element_type=self.preferred_element_type,
            )

        return product, (
            jax.ShapeDtypeStruct(self.lhs, self.lhs_dtype),
            jax.ShapeDtypeStruct(self.rhs, self.rhs_dtype),
        )


@dataclasses.dataclass
class Census:
    """The products of a computation and how often each runs."""

    counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    while_loops: int = 0  # bodies counted once: their trip count is not in the jaxpr

    @property
    def flops(self) -> int:
        return sum(p.flops * n for p, n in self.counts.items())


def _product(eqn: Any) -> Product:
    lhs, rhs = (v.aval for v in eqn.invars)
    preferred = eqn.params.get("preferred_element_type")
    return Product(
        tuple(lhs.shape),
        tuple(rhs.shape),
        str(lhs.dtype),
        str(rhs.dtype),
        tuple(tuple(tuple(d) for d in pair) for pair in eqn.params["dimension_numbers"]),
        eqn.params.get("precision"),
        None if preferred is None else str(jnp.dtype(preferred)),
    )


def _take_census(jaxpr: Any, times: int, census: Census) -> None:
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            census.counts[_product(eqn)] += times
            continue
        inner = [
            j.jaxpr if isinstance(j, jax_core.ClosedJaxpr) else j
            for j in jax_core.jaxprs_in_params(eqn.params)
        ]
        if name == "cond":  # one branch runs: count the costliest
            branches = []
            for branch in inner:
                branches.append(Census())
                _take_census(branch, times, branches[-1])
            if branches:
                chosen = max(branches, key=lambda c: c.flops)
                census.counts.update(chosen.counts)
                census.while_loops += chosen.while_loops
            continue
        repeat = eqn.params.get("length", 1) if name == "scan" else 1
        census.while_loops += name == "while"
        for sub in inner:
            _take_census(sub, times * repeat, census)


def census_of(fn: Callable[..., Any], *args: Any) -> Census:
    """Every `dot_general` `fn(*args)` runs (traced, not compiled), with multiplicity: once
    per scan iteration, the costliest branch of a cond, a while body once (counted in
    `while_loops`)."""
    census = Census()
    _take_census(jax.make_jaxpr(fn)(*args).jaxpr, 1, census)
    return census


def product_timers(
    products: Iterable[Product],
    options: dict[str, dict[str, Any]],
) -> dict[tuple[Product, str], Callable[[], float]]:
    """A timer of each product alone per library (`hardware.donating_timer`: random operands,
    each result written over the last, as the step writes into buffers it holds)."""
    timers: dict[tuple[Product, str], Callable[[], float]] = {}
    for product in products:
        fn, (a_spec, b_spec) = product.call()
        keys = jax.random.split(jax.random.key(0))
        a = jax.random.normal(keys[0], a_spec.shape).astype(a_spec.dtype)
        b = jax.random.normal(keys[1], b_spec.shape).astype(b_spec.dtype)
        for library, compile_options in options.items():
            try:
                timers[product, library] = hardware.donating_timer(fn, (a, b), compile_options)
            except jax.errors.JaxRuntimeError:  # a jaxlib without this library
                continue
    return timers


def samples_in_turn(timers: dict[Any, Callable[[], float]], reps: int) -> dict[Any, list[float]]:
    """`reps` samples of every timer, all of them in turn each repetition: a slow phase of
    a shared host then hits the step, its products and the peak probe alike."""
    samples: dict[Any, list[float]] = {key: [] for key in timers}
    for _ in range(reps):
        for key, seconds in timers.items():
            samples[key].append(seconds())
    return samples


def dispatch_seconds(reps: int = 50) -> float:
    """Median time of calling a compiled function that does almost nothing: what each
    stand-alone product pays on top of its work and a product inside the step does not (the
    step's many vector products, sums written as dots, are mostly this)."""
    one = jnp.ones(())
    seconds = hardware.donating_timer(lambda a, b: a + b, (one, one))
    return statistics.median(seconds() for _ in range(reps))


def ceiling(
    census: Census,
    timed: dict[Product, dict[str, float]],
    step_library: str,
    model_flops: float,
    peak: float,
) -> dict[str, Any]:
    """The census's matmul time at the step's library and at the best per product, and the
    MFU each would give if the step were its products alone."""
    own = sum(n * timed[p][step_library] for p, n in census.counts.items())
    best = sum(n * min(timed[p].values()) for p, n in census.counts.items())
    return {
        "matmul_s_step_library": own,
        "matmul_s_best_library": best,
        "ceiling_mfu_step_library": model_flops / own / peak,
        "ceiling_mfu_best_library": model_flops / best / peak,
    }


def step_timer(built: train_throughput.BuiltStep) -> Callable[[], float]:
    """A timer of the compiled train step (warmed up), stepping its own state."""
    one_step = train_throughput.SteppedState(built, built.compile())
    one_step()
    return interleave.timed(one_step)


def run(args: argparse.Namespace) -> dict[str, Any]:
    cfg = train_throughput.model_config(args)
    built = train_throughput.build_step(cfg, args.batch, args.inputs, args.targets)
    with built.layout.context():
        census = census_of(built.step_fn, built.state, built.data, built.rng)
    options = hardware.matmul_libraries()
    step_library = next(iter(options))
    peak_timer = hardware.matmul_timer(cfg.dtype, size=args.peak_size)
    timers = {
        "step": step_timer(built),
        "peak": peak_timer,
        **product_timers(census.counts, options),
    }
    samples = samples_in_turn(timers, args.reps)
    step_s = statistics.median(samples.pop("step"))
    peak = hardware.matmul_flop_count(args.peak_size) / min(samples.pop("peak"))
    overhead = dispatch_seconds()
    timed: dict[Product, dict[str, float]] = collections.defaultdict(dict)
    for (product, library), values in samples.items():
        timed[product][library] = max(statistics.median(values) - overhead, 0.0)
    model_flops = flops.train_step_flops(
        cfg,
        train_throughput.FAMILIES[args.family].feature_lengths(args.inputs, args.targets),
        args.batch,
    )
    rows = sorted(
        (
            {
                "product": p.describe(),
                "count": n,
                "flops": p.flops * n,
                "seconds": {lib: n * s for lib, s in timed[p].items()},
            }
            for p, n in census.counts.items()
        ),
        key=lambda row: -row["seconds"][step_library],
    )
    return {
        "family": args.family,
        "batch": args.batch,
        "inputs": args.inputs,
        "targets": args.targets,
        "dtype": cfg.dtype,
        "reps": args.reps,
        "products": len(census.counts),
        "product_calls": sum(census.counts.values()),
        "while_loops": census.while_loops,
        "product_flops": census.flops,
        "model_flops": model_flops,
        "step_s_median": step_s,
        "mfu": model_flops / step_s / peak,
        "peak_matmul_flops_per_s": peak,
        "peak_source": f"measured, {peak_timer.library}",
        "dispatch_s": overhead,
        "step_library": step_library,
        **ceiling(census, timed, step_library, model_flops, peak),
        "rows": rows,
        "device": str(jax.devices()[0].device_kind),
        "host": platform.node(),
        "jax": jax.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def print_table(result: dict[str, Any], top: int) -> None:
    libs = list(result["rows"][0]["seconds"]) if result["rows"] else []
    print(
        f"\n{result['family']}: batch {result['batch']} x {result['inputs']}+"
        f"{result['targets']}, {result['dtype']}: {result['product_calls']} products "
        f"({len(result['rows'])} distinct), {result['product_flops'] / 1e9:.1f} GFLOP "
        f"(model count {result['model_flops'] / 1e9:.1f})"
    )
    print(
        f"{'count':>5}  {'product':52s} {'GFLOP':>7} "
        + " ".join(f"{lib + ' ms':>12}" for lib in libs)
    )
    for row in result["rows"][:top]:
        print(
            f"{row['count']:5d}  {row['product'][:52]:52s} {row['flops'] / 1e9:7.2f} "
            + " ".join(f"{row['seconds'].get(lib, float('nan')) * 1e3:12.1f}" for lib in libs)
        )
    if len(result["rows"]) > top:
        print(f"  ... {len(result['rows']) - top} more in the JSON")
    peak = result["peak_matmul_flops_per_s"]
    print(f"\npeak ({result['peak_source']}): {peak / 1e9:.1f} GFLOP/s")
    print(f"step {result['step_s_median']:.3f} s: MFU {result['mfu']:.1%}")
    print(
        f"products alone at {result['step_library']}: {result['matmul_s_step_library']:.3f} s"
        f" -> MFU ceiling {result['ceiling_mfu_step_library']:.1%}"
    )
    print(
        f"products alone, fastest library each: {result['matmul_s_best_library']:.3f} s"
        f" -> MFU ceiling {result['ceiling_mfu_best_library']:.1%}"
    )
    print(
        f"step / products alone at {result['step_library']}: "
        f"{result['step_s_median'] / result['matmul_s_step_library']:.2f}"
    )
    print(f"70 % MFU needs a step of {result['model_flops'] / peak / 0.7:.3f} s")
    if result["while_loops"]:
        print(f"note: {result['while_loops']} while loop(s), their products counted once")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    train_throughput.add_model_arguments(parser)
    parser.add_argument(
        "--reps",
        type=int,
        default=7,
        help="rounds; each times the step, the peak probe and every product",
    )
    parser.add_argument("--peak_size", type=int, default=train_throughput.PROBE_SIZE)
    parser.add_argument("--top", type=int, default=20, help="products printed")
    parser.add_argument("--out", default="benchmarks/results/matmul_ceiling.json")
    args = parser.parse_args(argv)
    result = run(args)
    print_table(result, args.top)
    results_io.write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
