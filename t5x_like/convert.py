"""Convert HuggingFace checkpoints to ours and back, optionally verifying them.

    python -m t5x_like.convert --from_hf DIR --to CKPT_DIR [--verify] [--layout scanned]
    python -m t5x_like.convert --from_original DIR --to CKPT_DIR [--layout scanned]
    python -m t5x_like.convert --from_ckpt CKPT_DIR --to_hf DIR        (T5, BERT, GPT)
    python -m t5x_like.convert --from_ckpt CKPT_DIR --to CKPT_DIR --layout scanned|per_layer

DIR holds `config.json` and `model.safetensors` (or a sharded index; BERT also reads a
`pytorch_model.bin` with torch's weights-only loader, which cannot run code). The family (T5 or
BERT, OpenAI GPT, GPT-2) comes from config.json's `model_type`. `--verify` runs transformers'
PyTorch model and ours
on the same batch, prints `max_abs_logit_diff=<x>` and exits non-zero (writing nothing) when a
difference exceeds 1e-4. `--layout scanned` writes the layers stacked for a model with
`scan_layers=True` (any family); `--from_ckpt ... --to ... --layout` restacks an existing
checkpoint either way (a run's pretrained checkpoint also converts on the fly when loaded
through `init_checkpoint`). `--to_hf` exports a checkpoint in HuggingFace's layout, from either
layer layout: T5ForConditionalGeneration for T5, the LM-head model for GPT, and for BERT
BertForPreTraining for a pretraining run, BertForQuestionAnswering for a
SQuAD model, BertForSequenceClassification for a classifier (or, with `--hf_architecture`,
BertForMultipleChoice / BertForTokenClassification); fine-tuned HF checkpoints of those
classes import too.

`--from_original` reads a checkpoint in the format its authors released, recognised from its
files: Google's TF1 BERT (`bert_config.json`, `vocab.txt`, `bert_model.ckpt.*`), OpenAI's
GPT-1 (`params_shapes.json`, `params_{0..9}.npy`, `encoder_bpe_40000.json`,
`vocab_40000.bpe`), Mesh-TensorFlow T5 v1.0 / v1.1 (`checkpoint`, `model.ckpt-N.*`,
`operative_config.gin`, optionally its `sentencepiece.model`) and t5x (`checkpoint_N/` with
its msgpack `checkpoint` and TensorStore arrays). Its tokenizer files are kept in
CKPT_DIR/tokenizer/.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
import tempfile
from typing import Any, Callable, Iterator

from t5x_like import logs, storage
from t5x_like.checkpoints import (
    hf_families,
    hf_files,
    original_formats,
    params_io,
    scan_layout,
    tokenizer_files,
)
from t5x_like.errors import CheckpointError


@contextlib.contextmanager
def _local(path: str, write: bool = False) -> Iterator[str]:
    """A local directory for `path`: itself, or for a bucket (`gs://`) a temporary copy, since
    safetensors, torch and transformers read and write local files only. `write=True` copies
    what was written back to the bucket when the block ends without an error."""
    if not storage.is_remote(path):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="t5x_like_convert_") as local:
        if not write:
            logs.log(f"Copying {path} to {local} to read it")
            storage.copy_tree(path, local)
        yield local
        if write:
            logs.log(f"Copying {local} to {path}")
            storage.copy_tree(local, path)


def _import(args: argparse.Namespace) -> int:
    with _local(args.from_hf) as local:
        return _import_local(argparse.Namespace(**{**vars(args), "from_hf": local}))


def _import_local(args: argparse.Namespace) -> int:
    model_type = hf_files.read_config(args.from_hf).get(
        "model_type", hf_families.UNTYPED_MODEL_TYPE
    )
    family = hf_families.for_model_type(model_type)
    config, params = family.load(args.from_hf)
    logs.log(f"Read {args.from_hf}: {config}")
    if args.verify:
        diffs = family.verify(args.from_hf, config, params)
        for name, value in diffs.items():
            logs.log(f"max_abs_{name}_diff={value:.3e}")
        worst = max(diffs.values())
        if worst > hf_files.VERIFY_TOLERANCE:
            print(
                f"error: difference {worst:.3e} exceeds {hf_files.VERIFY_TOLERANCE:g}; "
                "no checkpoint written.",
                file=sys.stderr,
            )
            return 1
        logs.log(f"verified: within {hf_files.VERIFY_TOLERANCE:g} of the reference")
    tokenizer = family.tokenizer(args.from_hf, model_type)  # read (or refused) before writing
    if args.layout == "scanned":
        config, params = _relayout(config, params, scanned=True)
    _write(functools.partial(params_io.save_params, args.to, params, config), args.to, params)
    if tokenizer is None:
        logs.log(f"No tokenizer files in {args.from_hf}: none is kept with the checkpoint.")
    else:
        _keep_tokenizer(args.to, *tokenizer)
    return 0


def _keep_tokenizer(destination: str, files: dict[str, str], vocabulary: dict) -> None:
    kept = tokenizer_files.save(destination, files, vocabulary)
    logs.log(f"Kept its tokenizer ({', '.join(files)}) in {kept}")


def _import_original(args: argparse.Namespace) -> int:
    original = original_formats.for_path(args.from_original)
    logs.log(f"Reading {args.from_original} as {original.name}")
    imported = original.load(args.from_original)
    config, params = imported.config, imported.params
    logs.log(f"Read {args.from_original}: {config}")
    if args.layout == "scanned":
        config, params = _relayout(config, params, scanned=True)
    _write(functools.partial(params_io.save_params, args.to, params, config), args.to, params)
    if imported.vocabulary is not None:
        _keep_tokenizer(args.to, imported.tokenizer_files, imported.vocabulary)
    return 0


def _write(save: Callable[[], object], destination: str, params, what: str = "") -> None:
    """Run `save` (one orbax or safetensors write, which reports no progress of its own) between
    a line saying what is written and how big it is and a line saying where and how long."""
    import time

    from t5x_like.models.base import count_params

    started = time.monotonic()
    logs.log(f"Writing {destination}: {count_params(params):,} parameters, {_gib(params):.2f} GiB")
    save()
    logs.log(f"Wrote {destination}{what} in {time.monotonic() - started:.1f} s")


def _gib(params) -> float:
    import jax

    return sum(x.nbytes for x in jax.tree_util.tree_leaves(params)) / 2**30


def _relayout(config, params, scanned: bool):
    """(config, params) with the layers in the scanned or the per-layer layout."""
    import dataclasses

    return (
        dataclasses.replace(config, scan_layers=scanned),
        scan_layout.to_layout(params, scanned),
    )


def _read_checkpoint(path: str) -> tuple[Any, Any]:
    import jax

    directory = params_io.checkpoint_directory(path)
    config = params_io.restore_config(directory)
    logs.log(f"Reading {directory}")
    return config, jax.device_get(params_io.restore_saved_params(directory))


def _restack(args: argparse.Namespace) -> int:
    config, params = _relayout(*_read_checkpoint(args.from_ckpt), scanned=args.layout == "scanned")
    _write(
        functools.partial(params_io.save_params, args.to, params, config),
        args.to,
        params,
        f" ({args.layout} layers)",
    )
    return 0


def _export(args: argparse.Namespace) -> int:
    config, params = _read_checkpoint(args.from_ckpt)
    family = hf_families.for_config(config)
    with _local(args.to_hf, write=True) as local:
        save, architecture = family.export(local, params, config, args.hf_architecture)
        _write(save, args.to_hf, params, f" (config.json + model.safetensors, {architecture})")
        source = tokenizer_files.find(args.from_ckpt)
        written = tokenizer_files.export_hf(source, local) if source else []
    if written:
        logs.log(f"Wrote its tokenizer: {', '.join(written)}")
    else:
        logs.log(f"{args.from_ckpt} has no tokenizer saved with it: none written.")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from_hf", help="HuggingFace checkpoint directory to import")
    parser.add_argument(
        "--from_original",
        help="a checkpoint in its authors' format (Google TF1 BERT, OpenAI GPT-1, "
        "Mesh-TensorFlow T5, t5x) to import",
    )
    parser.add_argument(
        "--to", help="output orbax checkpoint directory (with --from_hf or --from_original)"
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="compare with the transformers PyTorch model (needs the test extra)",
    )
    parser.add_argument(
        "--from_ckpt", help="our checkpoint (a run's MODEL_DIR or a converted directory) to export"
    )
    parser.add_argument("--to_hf", help="output HuggingFace directory (with --from_ckpt)")
    parser.add_argument(
        "--layout",
        choices=("per_layer", "scanned"),
        help="layer layout to write: per_layer (layers_0..N-1; the default on "
        "import) or scanned (one stacked `layers`, for scan_layers=True)",
    )
    parser.add_argument(
        "--hf_architecture",
        choices=(
            "BertForSequenceClassification",
            "BertForMultipleChoice",
            "BertForTokenClassification",
        ),
        help="HF class of an exported `classifier` head (default: sequence classification)",
    )
    args = parser.parse_args(argv)
    try:
        if args.from_hf and args.to:
            return _import(args)
        if args.from_original and args.to:
            return _import_original(args)
        if args.from_ckpt and args.to_hf:
            return _export(args)
        if args.from_ckpt and args.to and args.layout:
            return _restack(args)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    parser.error(
        "give --from_hf DIR --to CKPT_DIR, --from_original DIR --to CKPT_DIR, "
        "--from_ckpt CKPT_DIR --to_hf DIR, or "
        "--from_ckpt CKPT_DIR --to CKPT_DIR --layout scanned|per_layer"
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
