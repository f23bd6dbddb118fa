"""The reference column of `train_throughput --compare-hf`: HuggingFace's PyTorch T5
(`T5ForConditionalGeneration`) of the same dimensions, one training step = forward, backward
and transformers' Adafactor (T5's relative-step settings), on CPU threads.

    python -m benchmarks.hf_t5_step --config '{...T5Config json...}' --batch 8 --inputs 512
        --targets 128 --steps 5 --threads 2 --out result.json

Run as its own process so its peak memory (max RSS) is its own; needs the `test` extra
(torch, transformers). With `--serve` it times nothing itself: `train_throughput --compare-hf`
asks it for one step at a time, alternating with its own steps (`benchmarks.interleave`).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from typing import Any, Callable

from benchmarks import interleave


def hf_config(cfg: dict[str, Any]):
    """transformers.T5Config with our T5Config's dimensions (dropout as configured)."""
    import transformers

    gated = tuple(cfg["mlp_activations"]) == ("gelu", "linear")
    if not gated and tuple(cfg["mlp_activations"]) != ("relu",):
        raise ValueError(f"No HuggingFace T5 feed-forward for {cfg['mlp_activations']}.")
    return transformers.T5Config(
        vocab_size=cfg["vocab_size"], d_model=cfg["emb_dim"], d_kv=cfg["head_dim"],
        d_ff=cfg["mlp_dim"], num_layers=cfg["num_encoder_layers"],
        num_decoder_layers=cfg["num_decoder_layers"], num_heads=cfg["num_heads"],
        relative_attention_num_buckets=cfg["relative_attention_num_buckets"],
        relative_attention_max_distance=cfg["relative_attention_max_distance"],
        dropout_rate=cfg["dropout_rate"], layer_norm_epsilon=cfg["layer_norm_epsilon"],
        feed_forward_proj="gated-gelu" if gated else "relu",
        tie_word_embeddings=cfg["logits_via_embedding"], decoder_start_token_id=0)


def make_step(cfg: dict[str, Any], batch: int, inputs: int, targets: int,
              threads: int) -> tuple[Callable[[], float], dict[str, Any]]:
    """One HF training step on fixed random tokens (returns the loss), after one warm-up step
    (allocations, optimizer state), and what describes the run."""
    import torch
    import transformers
    from transformers.optimization import Adafactor

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(hf_config(cfg))
    if not cfg["logits_via_embedding"]:  # transformers 5 keeps lm_head tied regardless
        model.lm_head = torch.nn.Linear(cfg["emb_dim"], cfg["vocab_size"], bias=False)
    model.train()
    optimizer = Adafactor(model.parameters(), lr=None, scale_parameter=True,
                          relative_step=True, warmup_init=False)
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(2, cfg["vocab_size"], (batch, inputs), generator=generator)
    labels = torch.randint(2, cfg["vocab_size"], (batch, targets), generator=generator)

    def step() -> float:
        loss = model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())  # (float() of a tensor that needs grad warns)

    step()
    info = {"threads": threads, "torch": torch.__version__,
            "transformers": transformers.__version__,
            "params": sum(p.numel() for p in model.parameters())}
    return step, info


def run(cfg: dict[str, Any], batch: int, inputs: int, targets: int, steps: int,
        threads: int) -> dict[str, Any]:
    """`steps` steps one after the other: their median."""
    step, info = make_step(cfg, batch, inputs, targets, threads)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    return {"step_s_median": step_s, "tokens_per_s": batch * (inputs + targets) / step_s,
            "final_loss": loss, **info, "host_max_rss_bytes": peak_rss_bytes()}


def serve(cfg: dict[str, Any], batch: int, inputs: int, targets: int,
          threads: int) -> dict[str, Any]:
    """Steps on request (`interleave.serve`), for a run that alternates them with ours; the
    step times are the requester's to keep."""
    step, info = make_step(cfg, batch, inputs, targets, threads)
    losses = []
    interleave.serve(interleave.timed(lambda: losses.append(step())))
    return {"final_loss": losses[-1] if losses else None, **info,
            "host_max_rss_bytes": peak_rss_bytes()}


def peak_rss_bytes() -> int:
    """This process's peak resident memory since it started (VmHWM; unlike ru_maxrss it is
    not carried over from the parent across exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="our T5Config as JSON")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--inputs", type=int, default=512)
    parser.add_argument("--targets", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--serve", action="store_true",
                        help="time nothing: run one step per 'step' line on stdin and answer "
                             "with its seconds (benchmarks.interleave); --steps is unused")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    cfg = json.loads(args.config)
    if args.serve:
        result = serve(cfg, args.batch, args.inputs, args.targets, args.threads)
    else:
        result = run(cfg, args.batch, args.inputs, args.targets, args.steps, args.threads)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
