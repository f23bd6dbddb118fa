"""The command line shared by train, eval and infer: gin files, `--gin.KEY=VALUE` bindings,
and errors a researcher can act on (exit code 2; 3 when training stopped on a NaN/Inf)
instead of tracebacks."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any, Callable, Sequence

from t5x_like import distributed, errors, gin_setup, host_runtime, train_settings


def parse_args(argv: Sequence[str], description: str) -> tuple[list[str], list[str]]:
    """(gin files, gin bindings) from --gin_file=F and --gin.KEY=VALUE arguments."""
    parser = argparse.ArgumentParser(
        description=description,
        epilog="Bindings: --gin.KEY=VALUE, e.g. --gin.MODEL_DIR=/tmp/run "
        "--gin.T5Config.dropout_rate=0.0 --gin.Data.batch_size=64",
    )
    parser.add_argument(
        "--gin_file",
        action="append",
        default=[],
        help="gin file; repeat for several (later ones override)",
    )
    args, rest = parser.parse_known_args(argv)
    bindings = []
    for arg in rest:
        if arg.startswith("--gin.") and "=" in arg:
            bindings.append(arg[len("--gin.") :])
        else:
            parser.error(f"unrecognised argument {arg!r}; gin bindings are --gin.KEY=VALUE")
    return args.gin_file, bindings


def one_line(error: BaseException) -> str:
    """The error's own message, without the note gin appends to errors raised inside a
    configurable ("In call to configurable 'train' (<function ...>)"): one line to read."""
    return str(error).split("\n  In call to configurable")[0]


def run(entry: Callable[[], Any], argv: Sequence[str] | None, description: str) -> int:
    """Hide the GPUs from TensorFlow, parse gin, start multi-process jax if configured, run
    `entry()`."""
    host_runtime.hide_gpus_from_tensorflow()  # before any TF op: gin parsing may run some
    files, bindings = parse_args(sys.argv[1:] if argv is None else argv, description)
    for path in files:
        if gin_setup.find_gin_file(path) is None:
            print(
                f"error: gin file {path} does not exist (relative to {os.getcwd()}, and not "
                "one of the shipped gin_configs/ files).",
                file=sys.stderr,
            )
            return 2
    try:
        gin_setup.parse_gin(files, bindings)
        distributed.initialize()
    except errors.ConfigError as e:  # (a ValueError: caught before the gin branch)
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ValueError, SyntaxError) as e:
        moved = train_settings.moved_binding(str(e))
        if moved:
            print(f"error: {moved}\n(gin said: {e})", file=sys.stderr)
            return 2
        print(
            f"error: bad gin configuration: {e}\nCheck the binding's spelling against the "
            "configurables in gin_configs/ (e.g. Data.batch_size, T5Config.emb_dim).",
            file=sys.stderr,
        )
        return 2
    try:
        entry()
    except errors.ConfigError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    except errors.NonFiniteLoss as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 3
    return 0


def main_of_module(module_name: str) -> None:
    """Run `module_name`'s `main()` and exit with its code. An entry point calls this when run
    as `python -m module_name`, before its own definitions: the file then runs as `__main__`,
    and its gin configurables would be registered under `__main__` as well as under the
    module's name once anything imports the module (`gin_setup.register_configurables` does), so
    a binding such as `train.model_dir` would match two configurables."""
    sys.exit(importlib.import_module(module_name).main())
