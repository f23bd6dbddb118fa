"""The reference column of `train_throughput --compare-hf`: HuggingFace's PyTorch model of the
same family and dimensions, one training step = forward, backward and the family's recipe
optimizer, on CPU threads:

- T5: `T5ForConditionalGeneration`, transformers' Adafactor (T5's relative-step settings);
- BERT: `BertForPreTraining` (masked LM at `targets` positions per row + next sentence), and
  BERT's AdamW (global-norm clipping at 1, eps 1e-6, weight decay 0.01 except biases and
  LayerNorm). HF's head projects every position onto the vocabulary and then ignores the
  unmasked ones; ours projects only the masked positions, as Google's BERT code does. MFU on
  both sides counts the model FLOPs of the masked positions only;
- decoder-only: `GPT2LMHeadModel` (pre-LN) or `OpenAIGPTLMHeadModel` (post-LN), loss at every
  position, the same AdamW.

    python -m benchmarks.hf_step --hf_config '{...config.json...}' --batch 8 --inputs 512
        --targets 128 --steps 5 --threads 2 --out result.json

`--hf_config` is the config.json our converters write for the model (`t5x_like.checkpoints`:
`hf_t5`, `hf_bert`, `hf_gpt`), so both sides are the same network by the same mapping that
exports checkpoints. Run as its own process, which imports neither jax nor t5x_like, so its
peak memory (max RSS) is HF's own; needs the `test` extra (torch, transformers). With
`--serve` it times nothing itself: `train_throughput --compare-hf` asks it for one step at a
time, alternating with its own steps (`benchmarks.interleave`).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from typing import Any, Callable

from benchmarks import interleave

# BERT's AdamW (`t5x_like.optimizers.bert_adamw`); the learning rate does not change the time.
ADAMW = {"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-6, "weight_decay": 0.01}
CLIP_NORM = 1.0


def _model(hf_config: dict[str, Any]):
    """The transformers model `hf_config` (a config.json) describes, in training mode."""
    import torch
    import transformers

    config = dict(hf_config)
    architecture = config.pop("architectures")[0]
    if config["model_type"] in ("gpt2", "openai-gpt"):  # no GPT-2 special ids in a small vocab
        config.update(bos_token_id=None, eos_token_id=None)
    model = getattr(transformers, architecture)(
        transformers.AutoConfig.for_model(config.pop("model_type"), **config)
    )
    if architecture == "T5ForConditionalGeneration" and not config["tie_word_embeddings"]:
        # transformers 5 ties lm_head to the input embedding of a new model regardless
        model.lm_head = torch.nn.Linear(config["d_model"], config["vocab_size"], bias=False)
    return model.train()


def _adamw(model):
    """BERT's AdamW: no weight decay on biases and LayerNorm parameters, the gradient clipped
    to global norm 1 before each update (done in the step)."""
    import torch

    def no_decay(name: str) -> bool:
        return name.endswith("bias") or "LayerNorm" in name or ".ln_" in name

    named = list(model.named_parameters())
    groups = [
        {"params": [p for n, p in named if not no_decay(n)]},
        {"params": [p for n, p in named if no_decay(n)], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, **ADAMW)


def _batch(
    model_type: str, vocab_size: int, batch: int, inputs: int, targets: int, generator
) -> tuple[dict[str, Any], int]:
    """(fixed random model inputs with labels, tokens the model reads per step) in the layout
    of `benchmarks.families`' batches."""
    import torch

    ids = lambda *shape: torch.randint(2, vocab_size, shape, generator=generator)  # noqa: E731
    if model_type == "t5":
        return {"input_ids": ids(batch, inputs), "labels": ids(batch, targets)}, batch * (
            inputs + targets
        )
    if model_type == "bert":
        labels = torch.full((batch, inputs), -100)
        for row in range(batch):
            positions = 1 + torch.randperm(inputs - 1, generator=generator)[:targets]
            labels[row, positions] = ids(targets)
        segments = (torch.arange(inputs) >= inputs // 2).long().expand(batch, inputs)
        return {
            "input_ids": ids(batch, inputs),
            "token_type_ids": segments,
            "attention_mask": torch.ones(batch, inputs, dtype=torch.long),
            "labels": labels,
            "next_sentence_label": torch.randint(0, 2, (batch,), generator=generator),
        }, batch * inputs
    tokens = ids(batch, inputs + targets)  # decoder-only: loss at every position
    return {"input_ids": tokens, "labels": tokens}, batch * (inputs + targets)


def make_step(
    hf_config: dict[str, Any], batch: int, inputs: int, targets: int, threads: int
) -> tuple[Callable[[], float], dict[str, Any]]:
    """One HF training step on fixed random tokens (returns the loss), after one warm-up step
    (allocations, optimizer state), and what describes the run."""
    import torch
    import transformers
    from transformers.optimization import Adafactor

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = _model(hf_config)
    model_type = hf_config["model_type"]
    if model_type == "t5":
        optimizer = Adafactor(
            model.parameters(), lr=None, scale_parameter=True, relative_step=True, warmup_init=False
        )
    else:
        optimizer = _adamw(model)
    features, tokens = _batch(
        model_type,
        hf_config["vocab_size"],
        batch,
        inputs,
        targets,
        torch.Generator().manual_seed(0),
    )

    def step() -> float:
        loss = model(**features).loss
        loss.backward()
        if model_type != "t5":
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())  # (float() of a tensor that needs grad warns)

    step()
    info = {
        "model": type(model).__name__,
        "optimizer": type(optimizer).__name__,
        "threads": threads,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokens_per_step": tokens,
        "params": sum(p.numel() for p in model.parameters()),
    }
    return step, info


def run(
    hf_config: dict[str, Any], batch: int, inputs: int, targets: int, steps: int, threads: int
) -> dict[str, Any]:
    """`steps` steps one after the other: their median."""
    step, info = make_step(hf_config, batch, inputs, targets, threads)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    return {
        "step_s_median": step_s,
        "tokens_per_s": info["tokens_per_step"] / step_s,
        "final_loss": loss,
        **info,
        "host_max_rss_bytes": peak_rss_bytes(),
    }


def serve(
    hf_config: dict[str, Any], batch: int, inputs: int, targets: int, threads: int
) -> dict[str, Any]:
    """Steps on request (`interleave.serve`), for a run that alternates them with ours; the
    step times are the requester's to keep."""
    step, info = make_step(hf_config, batch, inputs, targets, threads)
    losses = []
    interleave.serve(interleave.timed(lambda: losses.append(step())))
    return {
        "final_loss": losses[-1] if losses else None,
        **info,
        "host_max_rss_bytes": peak_rss_bytes(),
    }


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
    parser.add_argument(
        "--hf_config", required=True, help="the model's HuggingFace config.json, as JSON text"
    )
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--inputs", type=int, default=512)
    parser.add_argument("--targets", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--serve",
        action="store_true",
        help="time nothing: run one step per 'step' line on stdin and answer "
        "with its seconds (benchmarks.interleave); --steps is unused",
    )
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    hf_config = json.loads(args.hf_config)
    if args.serve:
        result = serve(hf_config, args.batch, args.inputs, args.targets, args.threads)
    else:
        result = run(hf_config, args.batch, args.inputs, args.targets, args.steps, args.threads)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
