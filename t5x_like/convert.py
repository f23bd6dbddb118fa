"""Convert a HuggingFace T5 checkpoint into an orbax checkpoint, optionally verifying it.

    python -m t5x_like.convert --from_hf DIR --to CKPT_DIR [--verify]

DIR holds `config.json` and `model.safetensors` (or a sharded index). `--verify` runs
transformers' PyTorch model and ours on the same batch, prints `max_abs_logit_diff=<x>` and
exits non-zero when the encoder output or the decoder logits differ by more than 1e-4.
"""

from __future__ import annotations

import argparse
import sys

from t5x_like.checkpoints import hf_reference, hf_t5, params_io


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from_hf", required=True, help="HuggingFace T5 checkpoint directory")
    parser.add_argument("--to", required=True, help="output orbax checkpoint directory")
    parser.add_argument("--verify", action="store_true",
                        help="compare with the transformers PyTorch model (needs the test extra)")
    args = parser.parse_args(argv)

    try:
        config, params = hf_t5.load_hf_checkpoint(args.from_hf)
    except hf_t5.CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"Read {args.from_hf}: {config}")

    if args.verify:
        hf_model = hf_reference.load_hf_model(args.from_hf)
        diffs = hf_reference.max_abs_differences(
            hf_model, config, params, hf_reference.example_batch(config.vocab_size))
        worst = max(diffs.values())
        print(f"max_abs_encoder_diff={diffs['encoder']:.3e}")
        print(f"max_abs_logit_diff={diffs['logits']:.3e}")
        if worst > hf_reference.VERIFY_TOLERANCE:
            print(f"error: difference {worst:.3e} exceeds {hf_reference.VERIFY_TOLERANCE:g}; "
                  "no checkpoint written.", file=sys.stderr)
            return 1
        print(f"verified: within {hf_reference.VERIFY_TOLERANCE:g} of the reference")

    path = params_io.save_params(args.to, params, config)
    print(f"Wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
