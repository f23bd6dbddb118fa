"""Beam search under `beam_rule='hf'` equals transformers' `generate(num_beams=K)`.

Reference: transformers' own models and `generate(num_beams=K, num_return_sequences=K,
length_penalty=alpha, early_stopping=...)`, one prompt at a time, returning every beam with
its `sequences_scores`. Ours decodes a padded batch of the imported parameters and must give
the same K hypotheses in the same order, token for token up to and including EOS, with scores
equal to 1e-4. Covered: GPT-2 with an EOS the beams reach (so the length penalty, the
finishing and the three early-stopping rules all decide something), OpenAI GPT without an EOS
(every beam ends at the length limit) and T5 (encoder-decoder; the decoder start token is not
counted in the length, as in HF). The t5x rule on the same model gives other scores, so the
comparison can fail.
"""

from __future__ import annotations

import numpy as np
import pytest

from t5x_like import decoding
from t5x_like.families.t5 import hf as hf_t5
from t5x_like.families.t5.model import EncoderDecoderModel

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from tests.test_gpt_hf_generation import NEW_TOKENS, PROMPTS, _ours, _reference, _until  # noqa: E402

K = 3
GPT2_EOS = 19  # GPT-2 greedy on PROMPTS[0] reaches it at its third token (checked below)


def _hf_beams(model, generate_kwargs, eos_id, alpha, early_stopping, prompt_len):
    with torch.no_grad():
        out = model.generate(
            **generate_kwargs,
            do_sample=False,
            num_beams=K,
            num_return_sequences=K,
            length_penalty=alpha,
            early_stopping=early_stopping,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=0,
            eos_token_id=eos_id,
            pad_token_id=eos_id if eos_id is not None else 0,
            output_scores=True,
            return_dict_in_generate=True,
        )
    seqs = [_until(row[prompt_len:].tolist(), eos_id) for row in out.sequences]
    return seqs, out.sequences_scores.numpy()


def _gpt_reference_beams(model, eos_id, alpha, early_stopping):
    rows = []
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        kwargs = dict(input_ids=ids, attention_mask=torch.ones_like(ids))
        rows.append(_hf_beams(model, kwargs, eos_id, alpha, early_stopping, len(prompt)))
    return rows


def _assert_same_beams(ours, reference, eos_id):
    seqs, scores = (np.asarray(x) for x in ours)
    for row, (want_seqs, want_scores) in enumerate(reference):
        assert [_until(s, eos_id) for s in seqs[row]] == want_seqs, row
        np.testing.assert_allclose(scores[row], want_scores, atol=1e-4, rtol=0)


def _beam(alpha, early_stopping=False, rule="hf"):
    return decoding.DecodeConfig(
        method="beam", beam_size=K, alpha=alpha, beam_rule=rule, early_stopping=early_stopping
    )


@pytest.fixture(scope="module")
def gpt2():
    return _reference("gpt2")


@pytest.mark.parametrize(
    "alpha, early_stopping",
    [(1.0, False), (2.0, False), (2.0, True), (2.0, "never"), (-1.0, "never"), (0.0, True)],
)
def test_gpt2_beams_equal_transformers(gpt2, alpha, early_stopping):
    reference = _gpt_reference_beams(gpt2, GPT2_EOS, alpha, early_stopping)
    ours = _ours("gpt2", gpt2, GPT2_EOS, _beam(alpha, early_stopping), all_beams=True)
    _assert_same_beams(ours, reference, GPT2_EOS)


def test_the_gpt2_case_decides_something(gpt2):
    """The EOS is reached early, and early_stopping changes HF's answer at alpha=2: the
    parametrised cases above are not all the same search."""
    greedy = _gpt_reference_beams(gpt2, None, 1.0, False)[0][0][0]
    assert greedy[2] == GPT2_EOS
    stop_when_full = _gpt_reference_beams(gpt2, GPT2_EOS, 2.0, True)
    never = _gpt_reference_beams(gpt2, GPT2_EOS, 2.0, "never")
    assert stop_when_full[0][0] != never[0][0]


def test_t5x_rule_scores_differently(gpt2):
    """Wu et al.'s penalty is not HF's: the same model under beam_rule='t5x' must not pass."""
    reference = _gpt_reference_beams(gpt2, GPT2_EOS, 1.0, False)
    ours = _ours("gpt2", gpt2, GPT2_EOS, _beam(1.0, rule="t5x"), all_beams=True)
    with pytest.raises(AssertionError):
        _assert_same_beams(ours, reference, GPT2_EOS)


def test_openai_gpt_without_eos_equals_transformers():
    model = _reference("openai-gpt")
    reference = _gpt_reference_beams(model, None, 1.0, False)
    ours = _ours("openai-gpt", model, None, _beam(1.0), all_beams=True)
    _assert_same_beams(ours, reference, None)


def _t5_reference():
    """A random T5.1.1-style model (gated GELU, untied head). Encoder and decoder have the
    same depth: transformers 5's generate sizes the decoder cache by the encoder's."""
    torch.manual_seed(1)
    config = transformers.T5Config(
        vocab_size=64,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
        dropout_rate=0.0,
        decoder_start_token_id=0,
        eos_token_id=1,
        pad_token_id=0,
    )
    model = transformers.T5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)  # peaked next-token distributions
    return model


@pytest.mark.parametrize("alpha, early_stopping", [(1.0, False), (0.5, True)])
def test_t5_beams_equal_transformers(alpha, early_stopping):
    hf_model = _t5_reference()
    config = hf_t5.config_from_hf(hf_model.config.to_dict())
    tensors = {k: v.numpy() for k, v in hf_model.state_dict().items()}
    params = hf_t5.params_from_hf(tensors, config)
    inputs = np.random.default_rng(2).integers(2, config.vocab_size, (3, 9)).astype(np.int32)
    inputs[0, 6:] = 0  # a shorter input, padded
    prompts = [
        dict(input_ids=torch.tensor(row[row > 0][None, :].astype(np.int64))) for row in inputs
    ]
    # The EOS: a token the first input's greedy reaches mid-way, so ending decides something.
    eos = int(_hf_beams(hf_model, prompts[0], None, 1.0, False, prompt_len=1)[0][0][3])
    reference = [_hf_beams(hf_model, p, eos, alpha, early_stopping, 1) for p in prompts]
    ours = EncoderDecoderModel(config, eos_id=eos).predict_batch(
        params,
        {"encoder_input_tokens": inputs},
        NEW_TOKENS,
        return_scores=True,
        decode=_beam(alpha, early_stopping),
        return_all_beams=True,
    )
    _assert_same_beams(ours, reference, eos)
    assert any(seq[-1] == eos for seq in reference[0][0])
