"""Train-step throughput: compile time, step time, tokens/s, MFU and memory, per model family.

    python -m benchmarks.train_throughput [--family t5|decoder_only|bert]
        [--batch 8] [--inputs 512] [--targets 128]
        [--dtype float32|bfloat16] [--gin_file gin_configs/models/t5_1_1/base.gin] [--steps 10]
        [--loss_chunk_length 32] [--remat_policy full] [--scan_layers] [--num_layers 12]
        [--compare-hf]

The default model is the family's standard benchmark config (`benchmarks.families`); for T5:
T5.1.1-style (gated-GELU, untied output), emb_dim 256, 4+4 layers, 4 heads of 64, mlp_dim
1024, vocab 32128, dropout 0, float32. The decoder-only model reads inputs+targets tokens per
row; BERT reads `inputs` tokens with `targets` masked predictions.
One step = the trainer's jitted, sharded step: forward, backward and an optax Adafactor update
(T5's settings). `--mesh_shape` / `--layout` choose the partitioning; memory is per device.

MFU = (model FLOPs per step / step time) / peak FLOP/s. Model FLOPs are the hand count of
`t5x_like.flops` (matmuls incl. attention scores and the vocabulary projection, x3 for
training; embedding lookups are not FLOPs), the same for every compilation of the step; XLA's
own count is printed beside it (it counts a loop body once, so a chunked loss or scanned layers
look cheaper to it). `--compare-hf` times HuggingFace's PyTorch model of the same family and
dimensions (`benchmarks.hf_step`: T5ForConditionalGeneration, BertForPreTraining, GPT-2 /
OpenAI GPT, each with its recipe's optimizer) in a second process, its steps alternating with
ours A B B A (`benchmarks.interleave`), so the speed ratio is taken round by round on the
same machine state. On accelerators the peak is the chip's datasheet dense bf16 rate
(`t5x_like.hardware`) times the devices; on CPUs, where
no datasheet peak applies, it is measured here as the best rate of a 2048² matmul in the same
dtype, so the number means "fraction of what this machine can do in a matmul"; also on an
accelerator missing from the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

import jax

from benchmarks import hf_step, interleave, matmul_probe, op_profile, results_io
from benchmarks.families import FAMILIES
from t5x_like import flops, hardware, partitioning, trainer
from t5x_like.checkpoints import scan_layout
from t5x_like.families.t5.hf import CheckpointError
from t5x_like.families.t5.network import T5Config
from t5x_like.gin_setup import bind_over, load_model_config
from t5x_like.models.base import count_params

BENCHMARK_CONFIG = FAMILIES["t5"].benchmark_config
PROBE_SIZE = 2048  # the matmul whose best rate is the MFU denominator


@dataclasses.dataclass
class BuiltStep:
    """The trainer's sharded step for a config, with everything it runs on: what the
    benchmarks compile, time and take apart."""

    family: Any
    layout: Any
    state: Any
    data: Any
    step_fn: Any
    rng: jax.Array

    def compile(self) -> Any:
        with self.layout.context():
            return self.step_fn.lower(self.state, self.data, self.rng).compile()


class SteppedState:
    """A compiled step applied to the state it holds: each call takes one step on the built
    batch, blocks until it is done, keeps the new state and returns the step's metrics."""

    def __init__(self, built: BuiltStep, compiled: Any):
        self.built, self.compiled = built, compiled
        self.state, self.metrics = built.state, None

    def __call__(self) -> Any:
        self.state, self.metrics = self.compiled(self.state, self.built.data, self.built.rng)
        self.metrics["loss"].block_until_ready()
        return self.metrics


def build_step(
    cfg: Any,
    batch: int,
    inputs: int,
    targets: int,
    mesh_shape: tuple[int, int] | None = None,
    layout_name: str = "auto",
    loss_chunk_length: int | None = None,
    nonfinite_policy: str = "stop",
) -> BuiltStep:
    """The step `t5x_like.train` runs, for the family `cfg` belongs to, on the given mesh,
    with the family's recipe optimizer, a synthetic batch and initialised state."""
    family = next(f for f in FAMILIES.values() if isinstance(cfg, f.config_class))
    model = family.make_model(cfg, loss_chunk_length)
    lr, optimizer = family.make_optimizer()
    mesh = partitioning.make_mesh(mesh_shape=mesh_shape or (jax.device_count(), 1))
    rules = partitioning.logical_axis_rules(
        layout_name, num_partitions=partitioning.model_axis_size(mesh)
    )
    partitioning.check_batch_size(batch, mesh, rules=rules)
    layout = trainer.make_layout(model, optimizer, mesh, rules)
    if getattr(cfg, "scan_layers", False):
        # nn.scan draws each layer's initial weights from other random streams than the
        # per-layer stack does: start from the per-layer stack's weights, stacked, so a step
        # with --scan_layers computes what the step without it does (`knob_effect` compares
        # their losses).
        per_layer = family.make_model(
            dataclasses.replace(cfg, scan_layers=False), loss_chunk_length
        )
        params = trainer.init_state(
            per_layer,
            optimizer,
            jax.random.key(0),
            trainer.make_layout(per_layer, optimizer, mesh, rules),
        ).params
        state = trainer.state_from_params(scan_layout.stack_layers(params), optimizer, layout)
    else:
        state = trainer.init_state(model, optimizer, jax.random.key(0), layout)
    data = partitioning.global_batch(family.make_batch(cfg, batch, inputs, targets), mesh, rules)
    step_fn = trainer.make_train_step(
        model, optimizer, lr, layout, nonfinite_policy=nonfinite_policy
    )
    return BuiltStep(family, layout, state, data, step_fn, jax.random.key(1))


def xla_step_bytes(compiled: Any) -> int | None:
    """The memory XLA plans for one compiled step: its temporaries, arguments and outputs,
    donated outputs counted once (None where the backend does not say)."""
    memory = compiled.memory_analysis()
    if memory is None:
        return None
    return int(
        memory.temp_size_in_bytes
        + memory.argument_size_in_bytes
        + memory.output_size_in_bytes
        - memory.alias_size_in_bytes
    )


def run(
    cfg: Any,
    batch: int,
    inputs: int,
    targets: int,
    steps: int,
    mesh_shape: tuple[int, int] | None = None,
    layout_name: str = "auto",
    loss_chunk_length: int | None = None,
    profile_dir: str | None = None,
    nonfinite_policy: str = "stop",
    alongside: interleave.StepServer | None = None,
) -> dict[str, Any]:
    """Time the trainer's own sharded step (the one `t5x_like.train` runs) on the given mesh,
    for the family `cfg` belongs to; with `profile_dir`, also trace two more steps there and
    summarise their XLA ops (`benchmarks.op_profile`). With `alongside` (another process's
    step), `steps` rounds alternate the two (`benchmarks.interleave`): `interleaved` holds the
    other's times and the per-round ratio other / ours (> 1: ours is faster)."""
    built = build_step(
        cfg, batch, inputs, targets, mesh_shape, layout_name, loss_chunk_length, nonfinite_policy
    )
    family, mesh = built.family, built.layout.mesh

    t = time.perf_counter()
    compiled = built.compile()
    compile_s = time.perf_counter() - t

    one_step = SteppedState(built, compiled)

    # On CPU the matmul rate is also sampled right before and right after every timed step,
    # so each step has a peak measured under the same load from the VM's neighbours (see
    # `paired_mfu`), in a worker process (`benchmarks.matmul_probe`: sampled here, it made
    # this process's peak RSS jump now and then).
    on_cpu = jax.devices()[0].platform == "cpu"
    rates: list[float] = []
    if on_cpu:
        probe_server = interleave.StepServer(
            matmul_probe.command(cfg.dtype, PROBE_SIZE), name="matmul probe"
        )
        probe_server.wait_ready()

        def probe() -> float:
            return matmul_probe.rate(probe_server.step(), PROBE_SIZE)

    one_step()  # warm-up
    timed_step = interleave.timed(one_step)

    def measured_step() -> float:
        if not on_cpu:
            return timed_step()
        before = probe()
        seconds = timed_step()
        rates.append((before + probe()) / 2)
        return seconds

    interleaved = None
    if alongside is None:
        times = [measured_step() for _ in range(steps)]
    else:  # `steps` rounds A B B A against the other process's step
        times, other_times, ratios = interleave.alternate(measured_step, alongside.step, steps)
        interleaved = {
            "rounds": steps,
            "other_steps_s": other_times,
            "ratios": ratios,
            "other_step_s_median": statistics.median(other_times),
            **interleave.quartiles(ratios),
        }
    step_s = statistics.median(times)
    loss = one_step.metrics["loss"]
    op_profile_summary = None
    if profile_dir:
        op_profile_summary = op_profile.profile(one_step, profile_dir)
    params = one_step.state.params

    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    xla_flops = float(cost.get("flops", 0.0)) if cost else 0.0
    model_flops = flops.train_step_flops(cfg, family.feature_lengths(inputs, targets), batch)
    xla_bytes = xla_step_bytes(compiled)
    device_stats = jax.devices()[0].memory_stats() or {}
    peak_source = "measured"
    if on_cpu:  # the best rate seen: five samples now, and those taken around the steps
        peak_flops = max([*(probe() for _ in range(5)), *rates])
        peak_source = f"measured, {probe_server.about}"  # the fastest matmul library
        probe_server.close()
    else:  # the datasheet peak of every chip, else one chip's measured rate times the chips
        peak_flops, _ = hardware.measure_matmul_flops(cfg.dtype, size=PROBE_SIZE)
        datasheet = hardware.device_peak_flops(jax.devices()[0].device_kind)
        if datasheet is not None:
            peak_flops, peak_source = datasheet, "datasheet bf16"
        peak_flops *= jax.device_count()
    tokens = batch * family.tokens_per_example(inputs, targets)
    return {
        "family": getattr(cfg, "FAMILY", "t5"),
        "params": count_params(params),
        "batch": batch,
        "inputs": inputs,
        "targets": targets,
        "dtype": cfg.dtype,
        "loss_chunk_length": loss_chunk_length,
        "remat_policy": getattr(cfg, "remat_policy", "none"),
        "scan_layers": getattr(cfg, "scan_layers", False),
        "compile_s": compile_s,
        "step_s_median": step_s,
        "tokens_per_step": tokens,
        "tokens_per_s": tokens / step_s,
        "flops_per_step": model_flops,
        "xla_flops_per_step": xla_flops,
        "achieved_flops_per_s": model_flops / step_s,
        "peak_matmul_flops_per_s": peak_flops,
        "peak_source": peak_source,
        "mfu": model_flops / step_s / peak_flops,
        "mfu_paired": paired_mfu(model_flops, times, rates) if rates else None,
        "xla_step_bytes": xla_bytes,
        "device_peak_bytes": device_stats.get("peak_bytes_in_use"),
        "host_max_rss_bytes": hf_step.peak_rss_bytes(),
        "final_loss": float(loss),
        "op_profile": op_profile_summary,
        "interleaved": interleaved,
        "device": str(jax.devices()[0].device_kind),
        "num_devices": jax.device_count(),
        "mesh": dict(mesh.shape),
        "layout": layout_name,
        "host": platform.node(),
        "jax": jax.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def paired_mfu(
    model_flops: float, step_times: list[float], matmul_rates: list[float]
) -> dict[str, float]:
    """MFU of each step against the mean matmul rate sampled just before and just after it:
    median and quartiles.

    The 2-core VMs these benchmarks run on switch between two speeds for seconds at a time
    (a 2048^2 matmul sampled back to back for 20 s: ~70 GFLOP/s, then ~130, then ~70 again:
    a neighbour takes one of the two cores). The best matmul rate of the run, the denominator
    of `mfu`, comes from a fast phase while the median step may not, so `mfu` understates the
    step by however loud the run was (the same code measured 47.6 % and 69.1 % an hour
    apart). Pairing each step with the rate around it cancels most of that; both numbers are
    reported, and a step that straddles a switch still adds spread."""
    mfus = [model_flops / t / r for t, r in zip(step_times, matmul_rates)]
    q1, median, q3 = (
        statistics.quantiles(mfus, n=4, method="inclusive") if len(mfus) > 1 else mfus * 3
    )
    return {
        "median": median,
        "q1": q1,
        "q3": q3,
        "matmul_rate_median": statistics.median(matmul_rates),
    }


def _fmt_bytes(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:,.1f} MiB"


def print_table(result: dict[str, Any]) -> None:
    rows = [
        ("parameters", f"{result['params']:,}"),
        (
            "batch x (inputs + targets)",
            f"{result['batch']} x ({result['inputs']} + {result['targets']}), {result['dtype']}",
        ),
        # BERT reads `inputs` tokens and predicts `targets` of them; the others read both
        ("tokens per step", f"{result['tokens_per_step']:,}"),
        (
            "remat policy",
            result["remat_policy"] + (", scanned layers" if result["scan_layers"] else ""),
        ),
        (
            "loss",
            "whole logits"
            if not result["loss_chunk_length"]
            else f"chunks of {result['loss_chunk_length']} positions",
        ),
        ("compile time", f"{result['compile_s']:.2f} s"),
        ("median step time", f"{result['step_s_median'] * 1e3:.1f} ms"),
        ("tokens/s", f"{result['tokens_per_s']:,.0f}"),
        (
            "model FLOPs per step",
            f"{result['flops_per_step']:.3e} (hand count; XLA's "
            f"{result['xla_flops_per_step']:.3e})",
        ),
        (
            f"peak ({result['peak_source']}, all devices)",
            f"{result['peak_matmul_flops_per_s'] / 1e9:,.1f} GFLOP/s",
        ),
        ("MFU", f"{100 * result['mfu']:.1f} %"),
        *(
            [
                (
                    "MFU, paired per step",
                    f"median {100 * paired['median']:.1f} % "
                    f"(interquartile {100 * paired['q1']:.1f} .. {100 * paired['q3']:.1f} %; "
                    "median rate "
                    f"{paired['matmul_rate_median'] / 1e9:,.1f} GFLOP/s)",
                )
            ]
            if (paired := result.get("mfu_paired"))
            else []
        ),
        ("XLA step memory", _fmt_bytes(result["xla_step_bytes"])),
        ("device peak memory", _fmt_bytes(result["device_peak_bytes"])),
        ("host max RSS", _fmt_bytes(result["host_max_rss_bytes"])),
        (
            "device",
            f"{result['device']} x{result['num_devices']}, mesh {result['mesh']}, "
            f"layout {result['layout']}",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def start_hf_reference(
    cfg: Any, batch: int, inputs: int, targets: int, out: str
) -> interleave.StepServer:
    """HuggingFace's PyTorch model of the same family, dimensions and batch in its own process
    (`benchmarks.hf_step --serve`, as many threads as this host has cores), built and warmed
    up, waiting to be asked for steps; it writes its description to `out` when closed."""
    family = next(f for f in FAMILIES.values() if isinstance(cfg, f.config_class))
    server = interleave.StepServer(
        [
            sys.executable,
            "-m",
            "benchmarks.hf_step",
            "--serve",
            "--hf_config",
            json.dumps(family.hf_config(cfg)),
            "--batch",
            str(batch),
            "--inputs",
            str(inputs),
            "--targets",
            str(targets),
            "--threads",
            str(os.cpu_count() or 1),
            "--out",
            out,
        ],
        name="HuggingFace reference",
    )
    server.wait_ready()  # before our compile, so neither slows the other's start
    return server


def hf_result(result: dict[str, Any], described: dict[str, Any]) -> dict[str, Any]:
    """The reference column: HF's step times as measured in the interleaved run."""
    step_s = result["interleaved"]["other_step_s_median"]
    return {
        **described,
        "step_s_median": step_s,
        "tokens_per_s": result["tokens_per_step"] / step_s,
        "mfu": result["flops_per_step"] / step_s / result["peak_matmul_flops_per_s"],
    }


def print_hf_comparison(result: dict[str, Any]) -> None:
    hf = result["hf"]
    rows = [
        ("", "t5x_like", f"HF {hf['model']} ({hf['threads']} threads)"),
        ("parameters", f"{result['params']:,}", f"{hf['params']:,}"),
        (
            "median step time",
            f"{result['step_s_median'] * 1e3:.1f} ms",
            f"{hf['step_s_median'] * 1e3:.1f} ms",
        ),
        ("tokens/s", f"{result['tokens_per_s']:,.0f}", f"{hf['tokens_per_s']:,.0f}"),
        ("MFU", f"{100 * result['mfu']:.1f} %", f"{100 * hf['mfu']:.1f} %"),
        (
            "host max RSS",
            _fmt_bytes(result["host_max_rss_bytes"]),
            _fmt_bytes(hf["host_max_rss_bytes"]),
        ),
    ]
    print()
    for what, ours, theirs in rows:
        print(f"{what:<18}  {ours:>18}  {theirs:>36}")
    rounds = result["interleaved"]
    print(
        f"speed ratio (t5x_like / HF tokens/s), per round of {rounds['rounds']} interleaved "
        f"A B B A rounds: median {rounds['ratio_median']:.3f}x "
        f"(interquartile {rounds['ratio_q1']:.3f} .. {rounds['ratio_q3']:.3f})"
    )


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The options `model_config` reads: family, shape of the batch, dtype, gin, remat, scan,
    depth."""
    parser.add_argument("--family", default="t5", choices=sorted(FAMILIES))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--inputs", type=int, default=512)
    parser.add_argument("--targets", type=int, default=128)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument(
        "--gin_file",
        action="append",
        default=[],
        help="model gin file(s) instead of the benchmark config",
    )
    parser.add_argument(
        "--gin",
        action="append",
        default=[],
        dest="bindings",
        help="gin binding over the benchmark config (or after --gin_file), "
        "e.g. --gin T5Config.num_encoder_layers=2",
    )
    parser.add_argument(
        "--remat_policy", default="none", help="none | full | dots | dots_no_batch | save_qkv_proj"
    )
    parser.add_argument(
        "--scan_layers",
        action="store_true",
        help="each stack as one nn.scan (compile time flat in depth)",
    )
    parser.add_argument(
        "--num_layers",
        type=int,
        default=None,
        help="encoder and decoder depth (default: the config's)",
    )


def model_config(args: argparse.Namespace) -> Any:
    """The family's benchmark config with the command line's `--gin` bindings on top, or with
    `--gin_file`s the config those files and bindings give (from the family's config class);
    then the command line's dtype, remat, scan and depth."""
    family = FAMILIES[args.family]
    if args.gin_file:
        cfg = load_model_config(args.gin_file, args.bindings, family.config_class)
    else:  # bindings alone edit the benchmark config
        cfg = bind_over(family.benchmark_config, args.bindings)
    changes = {"dtype": args.dtype}
    for name in ("remat_policy", "scan_layers"):
        value = getattr(args, name)
        if value != {"remat_policy": "none", "scan_layers": False}[name]:
            if not hasattr(cfg, name):
                raise SystemExit(f"--{name}: {type(cfg).__name__} has no {name}.")
            changes[name] = value
    if args.num_layers:
        depth = (
            ("num_encoder_layers", "num_decoder_layers")
            if isinstance(cfg, T5Config)
            else ("num_layers",)
        )
        changes.update(dict.fromkeys(depth, args.num_layers))
    return dataclasses.replace(cfg, **changes)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_arguments(parser)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--loss_chunk_length",
        type=int,
        default=None,
        help="chunked cross-entropy, this many target positions at a time",
    )
    parser.add_argument("--mesh_shape", default=None, help="data,model (default: all on data)")
    parser.add_argument(
        "--layout", default="auto", help="data_parallel | model_parallel | fsdp | auto"
    )
    parser.add_argument(
        "--compare-hf",
        dest="compare_hf",
        action="store_true",
        help="also time HuggingFace's PyTorch model of the same family and "
        "dimensions (needs the test extra: torch, transformers)",
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        default=None,
        help="also trace two steps into DIR and print the time per XLA op",
    )
    parser.add_argument(
        "--nonfinite_policy",
        default="stop",
        choices=trainer.NONFINITE_POLICIES,
        help="the step's NaN/Inf guard (Health.nonfinite_policy); 'none' = no "
        "guard, to measure its cost",
    )
    parser.add_argument("--out", default="benchmarks/results/train_throughput.json")
    args = parser.parse_args(argv)

    cfg = model_config(args)
    if args.compare_hf and args.steps < 2:
        parser.error("--compare-hf needs --steps >= 2 (rounds; the ratio's spread uses quartiles).")
    if args.compare_hf:
        try:
            FAMILIES[args.family].hf_config(cfg)
        except CheckpointError as e:
            parser.error(f"--compare-hf: {e}")
    mesh_shape = tuple(int(x) for x in args.mesh_shape.split(",")) if args.mesh_shape else None
    with tempfile.TemporaryDirectory() as tmp:
        hf_out = os.path.join(tmp, "hf.json")
        hf = (
            start_hf_reference(cfg, args.batch, args.inputs, args.targets, hf_out)
            if args.compare_hf
            else None
        )
        try:
            result = run(
                cfg,
                args.batch,
                args.inputs,
                args.targets,
                args.steps,
                mesh_shape,
                args.layout,
                args.loss_chunk_length,
                args.profile,
                args.nonfinite_policy,
                alongside=hf,
            )
        finally:
            if hf is not None:
                hf.close()
        if hf is not None:
            with open(hf_out) as f:
                result["hf"] = hf_result(result, json.load(f))
    result["config"] = cfg.to_json()
    print_table(result)
    if result["op_profile"]:
        op_profile.print_profile(result["op_profile"])
    if "hf" in result:
        print_hf_comparison(result)
    results_io.write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
