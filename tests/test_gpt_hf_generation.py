"""Generation of imported GPT-2 and OpenAI GPT models equals transformers' `generate`.

The reference is transformers' own models and `generate(do_sample=False)`, one prompt at a
time. Ours runs the imported parameters with the model's own conventions (GPT-2: no start
token, `<|endoftext|>`-style EOS from its config; OpenAI GPT: neither) on a batch of prompts of
different lengths that contain id 0 (GPT-2's '!'), padded and given with explicit lengths:
greedy tokens must be the same, token for token, up to and including EOS. Sampling with a fixed
key is reproducible. Beam search against HF's: test_hf_beam_search.py.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from t5x_like import decoding
from t5x_like.families.gpt import hf as hf_gpt
from t5x_like.families.gpt.model import DecoderOnlyModel

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SIZES = dict(vocab_size=61, n_positions=48, n_embd=32, n_layer=2, n_head=4)
PROMPTS = [[0, 9, 13, 0, 22, 5], [31, 0], [17, 8, 40]]  # id 0 is a real token here
NEW_TOKENS = 10


def _reference(family: str):
    torch.manual_seed(0)
    if family == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**SIZES))
    else:
        model = transformers.OpenAIGPTLMHeadModel(transformers.OpenAIGPTConfig(**SIZES))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)  # peaked next-token distributions: greedy is well defined
    return model.eval()


def _hf_greedy(model, prompt: list[int], eos_id: int | None) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=0,
            eos_token_id=eos_id,
            pad_token_id=eos_id if eos_id is not None else 0,
        )
    return out[0, len(prompt) :].tolist()


def _ours(family: str, model, eos_id: int | None, decode=None, rng=None, all_beams=False):
    """Our decoding of PROMPTS (padded, with lengths) with the imported parameters: tokens,
    or with `all_beams` (tokens (batch, beam, len), scores) of every beam."""
    cfg = hf_gpt.config_from_hf(model.config.to_dict())
    params = hf_gpt.params_from_hf({k: v.numpy() for k, v in model.state_dict().items()}, cfg)
    ours = DecoderOnlyModel(cfg, attention="causal", start_token_id=None, eos_id=eos_id)
    width = max(map(len, PROMPTS))
    batch = {
        "prompt_tokens": np.asarray([p + [0] * (width - len(p)) for p in PROMPTS], np.int32),
        "prompt_lengths": np.asarray([len(p) for p in PROMPTS], np.int32),
    }
    if all_beams:
        return ours.predict_batch(
            params, batch, NEW_TOKENS, True, decode, return_all_beams=True, rng=rng
        )
    return np.asarray(ours.predict_batch(params, batch, NEW_TOKENS, decode=decode, rng=rng))


def _until(tokens, eos_id):
    out = []
    for t in tokens:
        out.append(int(t))
        if eos_id is not None and t == eos_id:
            break
    return out


@pytest.mark.parametrize("family", ["gpt2", "openai-gpt"])
def test_greedy_equals_transformers_generate(family):
    model = _reference(family)
    eos_id = None
    if family == "gpt2":
        # An EOS the first prompt reaches mid-way, so stopping is tested too.
        eos_id = _hf_greedy(model, PROMPTS[0], None)[4]
    want = [_hf_greedy(model, p, eos_id) for p in PROMPTS]
    got = _ours(family, model, eos_id)
    for row, reference in zip(got, want):
        assert _until(row, eos_id) == reference
    if eos_id is not None:
        assert eos_id in want[0]  # the EOS case was exercised


def test_sampling_with_a_fixed_key_is_reproducible():
    model = _reference("gpt2")
    sample = decoding.DecodeConfig(method="sample", temperature=1.0)
    first = _ours("gpt2", model, None, sample, jax.random.key(3))
    again = _ours("gpt2", model, None, sample, jax.random.key(3))
    other = _ours("gpt2", model, None, sample, jax.random.key(4))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
