"""Memory planner: will this model, layout and batch fit, and how much does each device hold?

    python -m t5x_like.plan --gin_file=gin_configs/models/t5_1_0/11B.gin \\
        --num_devices=32 --mesh_shape=4,8 --layout=fsdp --batch_size=128

Lowers and compiles the real train step ahead of time for N simulated CPU devices from abstract
shapes (nothing is allocated), then prints per-device bytes of parameters, optimizer state and
XLA's temporaries (activations and workspace), the FLOPs of a step, and whether it fits each
accelerator in `ACCELERATOR_MEMORY`. CPU compilation stands in for the target's: buffer sizes
follow from the partitioned program, while a TPU/GPU compiler may fuse and schedule differently,
so treat the verdict as a planning estimate with a margin, not a guarantee.

Give it the run's gin files as well (`--gin_file=gin_configs/runs/pretrain.gin`) to plan the run
as `t5x_like.train` would take it: its batch size, feature lengths, micro-batches and optimizer;
a flag given here overrides the run's binding.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Sequence

GiB = 2**30
# Memory per JAX device (a TPU v3 device is one core, half a chip).
ACCELERATOR_MEMORY = {
    "TPU v3": 16 * GiB,
    "TPU v4": 32 * GiB,
    "TPU v5e": 16 * GiB,
    "TPU v5p": 95 * GiB,
    "A100 80GB": 80 * GiB,
    "H100": 80 * GiB,
    "H200": 141 * GiB,
}
# Keep this much of a device free for the runtime, fragmentation and the compiler's choices.
HEADROOM = 0.9


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gin_file", action="append", default=[], help="model gin file(s)")
    parser.add_argument(
        "--gin",
        action="append",
        default=[],
        dest="bindings",
        help="extra binding, e.g. --gin T5Config.dtype=bfloat16",
    )
    parser.add_argument("--num_devices", type=int, default=8)
    parser.add_argument(
        "--mesh_shape",
        default=None,
        help="one size per mesh axis, e.g. 4,8 (default: all devices on data)",
    )
    parser.add_argument(
        "--mesh_axes",
        default="data,model",
        help="mesh axis names, e.g. data,fsdp,model with --layout=hybrid_fsdp",
    )
    parser.add_argument(
        "--layout", default="auto", help="data_parallel | model_parallel | fsdp | auto"
    )
    # None: the run's binding (Data.batch_size, ...) when a gin file makes one, else train's
    # default (`run_defaults`).
    parser.add_argument("--batch_size", type=int, default=None, help="default 128")
    parser.add_argument("--inputs", type=int, default=None, help="default 512")
    parser.add_argument("--targets", type=int, default=None, help="default 114")
    parser.add_argument("--num_microbatches", type=int, default=None, help="default 1")
    parser.add_argument("--json", default=None, help="also write the numbers here")
    return parser.parse_args(argv)


def _group_default(group: type, name: str) -> Any:
    """A run setting's default: the field default of its train_settings group."""
    import dataclasses

    field = next(f for f in dataclasses.fields(group) if f.name == name)
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def run_defaults() -> dict[str, Any]:
    """train's defaults (the T5 baseline) for what neither a flag nor the run's gin file sets."""
    from t5x_like.train_settings import Data, Optimizer

    lengths = _group_default(Data, "task_feature_lengths")
    return {
        "batch_size": _group_default(Data, "batch_size"),
        "inputs": lengths["inputs"],
        "targets": lengths["targets"],
        "num_microbatches": _group_default(Optimizer, "num_microbatches"),
        "optimizer": _group_default(Optimizer, "kind"),
    }


def _run_bindings() -> dict[str, Any]:
    """What the parsed gin files bind for the run: `train`'s own settings and those of its
    `Data` and `Optimizer` groups, keyed by name (nothing when only a model file was read,
    where they are not even registered)."""
    import gin

    bindings: dict[str, Any] = {}
    for scope, prefix in (("train", ""), ("Data", "data."), ("Optimizer", "optimizer.")):
        try:
            bindings.update({prefix + k: v for k, v in gin.get_bindings(scope).items()})
        except ValueError:
            pass
    return bindings


def _with_run_settings(args: argparse.Namespace, run: dict[str, Any]) -> argparse.Namespace:
    """`args` with each setting left unset taken from the run's bindings `run`
    (`_run_bindings`), else from `run_defaults()`. The planner compiles T5's step: a run of
    another model class is an error."""
    from t5x_like.errors import ConfigError
    from t5x_like.models import base

    model_class = run.get("model_class", base.default_model_class())
    if model_class is not base.default_model_class():
        raise ConfigError(
            f"the run's gin file trains {getattr(model_class, '__name__', model_class)}; the "
            "planner plans T5's encoder-decoder train step only. Give it the model's gin file "
            "and --batch_size/--inputs/--targets instead."
        )
    lengths = dict(run.get("data.task_feature_lengths", {}))
    from_run = {
        "batch_size": run.get("data.batch_size"),
        "inputs": lengths.get("inputs"),
        "targets": lengths.get("targets"),
        "num_microbatches": run.get("optimizer.num_microbatches"),
        "optimizer": run.get("optimizer.kind"),
    }
    settings = {
        name: next(v for v in (getattr(args, name, None), from_run[name], default) if v is not None)
        for name, default in run_defaults().items()
    }
    return argparse.Namespace(**{**vars(args), **settings})


def plan(args: argparse.Namespace) -> dict[str, Any]:
    """Compile the train step for the requested mesh and collect its memory and FLOPs."""
    import jax

    from t5x_like import optimizers, partitioning, trainer
    from t5x_like.gin_setup import load_model_config
    from t5x_like.models import base

    if jax.device_count() != args.num_devices:
        raise SystemExit(
            f"jax sees {jax.device_count()} devices, not {args.num_devices}: run "
            "the planner in a fresh process (XLA_FLAGS must be set before jax "
            "starts)."
        )
    cfg = load_model_config(args.gin_file, args.bindings)
    args = _with_run_settings(args, _run_bindings())
    model = base.default_model_class()(cfg)
    lr = optimizers.inverse_sqrt_schedule()
    optimizer = optimizers.make_optimizer(args.optimizer, lr)
    axis_names = tuple(args.mesh_axes.split(","))
    mesh_shape = (
        tuple(int(x) for x in args.mesh_shape.split(","))
        if args.mesh_shape
        else (args.num_devices,) + (1,) * (len(axis_names) - 1)
    )
    mesh = partitioning.make_mesh(mesh_shape=mesh_shape, axis_names=axis_names)
    rules = partitioning.logical_axis_rules(
        args.layout, num_partitions=partitioning.model_axis_size(mesh)
    )
    partitioning.check_batch_size(args.batch_size, mesh, args.num_microbatches, rules)
    layout = trainer.make_layout(model, optimizer, mesh, rules)
    state = trainer.abstract_state(model, optimizer, layout)

    def tokens(length: int):
        return jax.ShapeDtypeStruct(
            (args.batch_size, length), jax.numpy.int32, sharding=layout.batch_sharding
        )

    batch = {
        "encoder_input_tokens": tokens(args.inputs),
        "encoder_segment_ids": tokens(args.inputs),
        "decoder_input_tokens": tokens(args.targets),
        "decoder_target_tokens": tokens(args.targets),
        "decoder_segment_ids": tokens(args.targets),
        "decoder_loss_weights": jax.ShapeDtypeStruct(
            (args.batch_size, args.targets), jax.numpy.float32, sharding=layout.batch_sharding
        ),
    }
    step = trainer.make_train_step(model, optimizer, lr, layout, args.num_microbatches)
    start = time.perf_counter()
    with layout.context():
        compiled = step.lower(state, batch, jax.random.key(0)).compile()
    compile_s = time.perf_counter() - start

    param_bytes = partitioning.state_bytes_per_device(state.params, layout.state_shardings.params)
    opt_bytes = partitioning.state_bytes_per_device(
        state.opt_state, layout.state_shardings.opt_state
    )
    # What a checkpoint holds: every parameter and optimizer-state array, whole.
    checkpoint_bytes = sum(
        int(x.size) * x.dtype.itemsize
        for x in jax.tree_util.tree_leaves((state.params, state.opt_state))
        if hasattr(x, "dtype")
    )
    memory = compiled.memory_analysis()
    temp = int(memory.temp_size_in_bytes)
    args_bytes = int(memory.argument_size_in_bytes)
    out_bytes = int(memory.output_size_in_bytes)
    alias = int(memory.alias_size_in_bytes)
    peak = args_bytes + out_bytes - alias + temp
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops = float((cost or {}).get("flops", 0.0))
    return {
        "model": " + ".join(args.gin_file) or "T5Config defaults",
        "parameters": base.count_params(state.params),
        "num_devices": args.num_devices,
        "mesh": dict(mesh.shape),
        "layout": args.layout,
        "rules": [list(r) for r in rules],
        "batch": [args.batch_size, args.inputs, args.targets],
        "num_microbatches": args.num_microbatches,
        "optimizer": args.optimizer,
        "compile_s": compile_s,
        "bytes_per_device": {
            "parameters": param_bytes,
            "optimizer_state": opt_bytes,
            "temporaries": temp,
            "arguments": args_bytes,
            "outputs": out_bytes,
            "aliased": alias,
            "peak_estimate": peak,
        },
        "checkpoint_bytes": checkpoint_bytes,
        "flops_per_step_per_device": flops,
        "flops_per_step": flops * args.num_devices,
        "fits": {name: peak <= HEADROOM * size for name, size in ACCELERATOR_MEMORY.items()},
    }


def _gib(n: float) -> str:
    return f"{n / GiB:,.2f} GiB"


def print_report(result: dict[str, Any]) -> None:
    b = result["bytes_per_device"]
    print(f"model            {result['model']} ({result['parameters']:,} parameters)")
    print(
        f"mesh             {result['mesh']} on {result['num_devices']} devices, layout "
        f"{result['layout']}"
    )
    print(
        f"batch            {result['batch'][0]} x ({result['batch'][1]} + "
        f"{result['batch'][2]}) tokens, {result['num_microbatches']} micro-batch(es)"
    )
    print(f"optimizer        {result['optimizer']}")
    print(f"compile          {result['compile_s']:.1f} s (CPU, ahead of time)")
    print("per device:")
    print(f"  parameters       {_gib(b['parameters'])}")
    print(f"  optimizer state  {_gib(b['optimizer_state'])}")
    print(f"  temporaries      {_gib(b['temporaries'])}  (activations, gradients, workspace)")
    print(
        f"  peak estimate    {_gib(b['peak_estimate'])}  (arguments + outputs - donated + "
        "temporaries)"
    )
    print(
        f"checkpoint       {_gib(result['checkpoint_bytes'])} a step on disk (parameters + "
        "optimizer state; Checkpointing.keep=K needs K + 1 while the newest is written)"
    )
    print(
        f"FLOPs per step   {result['flops_per_step']:.3e} "
        f"({result['flops_per_step_per_device']:.3e} per device)"
    )
    print(f"fits (peak <= {HEADROOM:.0%} of device memory):")
    for name, ok in result["fits"].items():
        size = ACCELERATOR_MEMORY[name]
        print(
            f"  {name:<10} {_gib(size):>11}  {'yes' if ok else 'NO '}  "
            f"({100 * b['peak_estimate'] / size:.0f}% used)"
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    # Simulated devices must be requested before jax initialises its CPU backend.
    flags = [
        f
        for f in os.environ.get("XLA_FLAGS", "").split()
        if not f.startswith("--xla_force_host_platform_device_count")
    ]
    flags.append(f"--xla_force_host_platform_device_count={args.num_devices}")
    os.environ["XLA_FLAGS"] = " ".join(flags)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from t5x_like.errors import ConfigError

    try:
        result = plan(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # gin's, for a binding nothing defines
        from t5x_like.train_settings import moved_binding

        moved = moved_binding(str(e))
        if moved is None:
            raise
        print(f"error: {moved}", file=sys.stderr)
        return 2
    print_report(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
