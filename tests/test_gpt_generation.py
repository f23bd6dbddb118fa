"""Decoder-only generation on the key/value cache equals re-running the full forward pass.

The reference is the plain, cache-free network: at each step the whole sequence (start token,
prompt, tokens so far) goes through `DecoderOnly` with the training mask and the argmax of the
last position is the next token. The cached decoder must pick the same tokens with the same
log-probabilities, for GPT-1-style (learned positions, post-LN) and T5-style (RMS norm,
relative bias) models, causal and prefix LM, on prompts of different lengths in one batch.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like import decoding
from t5x_like.families.gpt.model import DecoderOnlyModel
from t5x_like.families.gpt.network import GPTConfig

GPT_STYLE = GPTConfig(
    vocab_size=50,
    max_position_embeddings=32,
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    intermediate_size=64,
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
)
T5_STYLE = GPTConfig(
    vocab_size=50,
    max_position_embeddings=32,
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    intermediate_size=64,
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
    pre_layer_norm=True,
    norm="rms_norm",
    use_bias=False,
    position_encoding="relative",
    activation="gated-gelu",
    initialization="t5",
    tie_embeddings=False,
    relative_attention_bidirectional=True,
)
PROMPTS = [[5, 9, 13, 7, 22], [31, 4], [17, 8, 40, 3]]
NEW_TOKENS = 6


def _forward(model: DecoderOnlyModel):
    return jax.jit(
        lambda params, tokens, visible: model.module.apply(
            {"params": params}, tokens, causal_attention=visible
        )
    )


def _predict(model: DecoderOnlyModel, params, prompts, steps, **kwargs):
    return jax.jit(lambda p, batch: model.predict_batch(p, batch, steps, **kwargs))(
        params, {"prompt_tokens": _padded(prompts)}
    )


def _reference_greedy(model: DecoderOnlyModel, params, prompt: list[int], steps: int):
    """Cache-free greedy continuation: full forward over [start] + prompt + generated, right
    padded to one width (causal attention keeps the padding out of the real positions)."""
    forward = _forward(model)
    width = 1 + max(map(len, PROMPTS)) + steps
    sequence = [model.start_token_id] + prompt
    prefix = len(sequence) if model.attention == "prefix" else 0
    visible = jnp.asarray([[1] * prefix + [0] * (width - prefix)])
    generated, total = [], 0.0
    for _ in range(steps):
        tokens = jnp.asarray([sequence + [0] * (width - len(sequence))])
        logits = forward(params, tokens, visible)
        log_probs = jax.nn.log_softmax(logits[0, len(sequence) - 1])
        token = int(jnp.argmax(log_probs))
        generated.append(token)
        total += float(log_probs[token])
        if token == model.eos_id:
            break
        sequence.append(token)
    return generated, total


def _padded(prompts):
    width = max(map(len, prompts))
    return np.array([p + [0] * (width - len(p)) for p in prompts], np.int32)


@pytest.mark.parametrize(
    "config,attention",
    [(GPT_STYLE, "causal"), (GPT_STYLE, "prefix"), (T5_STYLE, "prefix"), (T5_STYLE, "causal")],
)
def test_cached_greedy_equals_full_forward(config, attention):
    model = DecoderOnlyModel(config, attention=attention, eos_id=-1)  # no early stop
    params = model.init(jax.random.key(3))
    tokens, scores = _predict(model, params, PROMPTS, NEW_TOKENS, return_scores=True)
    for row, prompt in enumerate(PROMPTS):
        expected, expected_score = _reference_greedy(model, params, prompt, NEW_TOKENS)
        np.testing.assert_array_equal(np.asarray(tokens[row]), expected)
        np.testing.assert_allclose(float(scores[row]), expected_score, rtol=1e-5, atol=1e-5)


def test_prefix_lm_sees_the_whole_prompt_and_causal_lm_does_not():
    """Changing the prompt's last token changes what a prefix LM computes for the first prompt
    token (it attends forward), which a causal LM cannot see; the generation path must honour
    that difference: cached prefix-LM logits equal the full prefix-LM forward, not the causal
    one."""
    model = DecoderOnlyModel(GPT_STYLE, attention="prefix", eos_id=-1)
    params = model.init(jax.random.key(0))
    prompt = PROMPTS[0]
    generated, _ = _reference_greedy(model, params, prompt, 1)
    tokens = _predict(model, params, [prompt], 1)
    assert int(tokens[0, 0]) == generated[0]
    seq = jnp.asarray([[0] + prompt])
    full = model.module.apply({"params": params}, seq, causal_attention=jnp.ones_like(seq))
    causal = model.module.apply({"params": params}, seq)
    assert not np.allclose(full[0, -1], causal[0, -1])  # the two masks really differ


def test_beam_search_and_sampling_run_through_the_shared_loops():
    model = DecoderOnlyModel(T5_STYLE, attention="prefix", eos_id=-1)
    params = model.init(jax.random.key(1))
    greedy, greedy_scores = _predict(model, params, PROMPTS, NEW_TOKENS, return_scores=True)
    beams, beam_scores = _predict(
        model,
        params,
        PROMPTS,
        NEW_TOKENS,
        return_scores=True,
        return_all_beams=True,
        decode=decoding.DecodeConfig(method="beam", beam_size=3, alpha=0.0),
    )
    assert beams.shape == (len(PROMPTS), 3, NEW_TOKENS)
    # The best beam is at least as likely as greedy's sequence (alpha 0: plain log-prob).
    assert np.all(np.asarray(beam_scores[:, 0]) >= np.asarray(greedy_scores) - 1e-5)
    # Each beam's score is its teacher-forced log-likelihood under the full forward pass.
    forward = _forward(model)
    for row, prompt in enumerate(PROMPTS):
        for beam in range(3):
            sequence = [0] + prompt + [int(t) for t in beams[row, beam]]
            seq = jnp.asarray([sequence])
            visible = jnp.asarray([[1] * (len(prompt) + 1) + [0] * NEW_TOKENS])
            log_probs = jax.nn.log_softmax(forward(params, seq, visible)[0])
            start = len(prompt)
            expected = sum(
                float(log_probs[start + i, sequence[start + 1 + i]]) for i in range(NEW_TOKENS)
            )
            np.testing.assert_allclose(
                float(beam_scores[row, beam]), expected, rtol=1e-4, atol=1e-4
            )
    cold = _predict(
        model,
        params,
        PROMPTS,
        NEW_TOKENS,
        decode=decoding.DecodeConfig(method="sample", temperature=0.0),
    )
    np.testing.assert_array_equal(np.asarray(cold), np.asarray(greedy))


def test_prompt_longer_than_the_position_table_is_refused():
    model = DecoderOnlyModel(GPT_STYLE)
    params = model.init(jax.random.key(0))
    with pytest.raises(ValueError, match="learned positions"):
        model.predict_batch(params, {"prompt_tokens": np.ones((1, 30), np.int32)}, 8)


@pytest.mark.slow  # a command-line run (the default suite must stay under 15 minutes)
def test_infer_command_continues_prompts_with_a_decoder_only_checkpoint(tmp_path):
    """`python -m t5x_like.infer` with `infer.model_class=@DecoderOnlyModel` and
    `add_eos=False` writes, for each line of a prompt file, the greedy continuation that the
    cache-free full forward pass produces."""
    import json

    import seqio

    from t5x_like import (
        infer,
        tasks,  # noqa: F401  (registers offline_lm)
    )
    from t5x_like.checkpoints import params_io
    from t5x_like.families.t5 import network as t5

    config = GPTConfig(
        vocab_size=2048,
        max_position_embeddings=64,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        intermediate_size=64,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
    )
    model = DecoderOnlyModel(config, attention="causal")
    params = t5.nn.meta.unbox(model.init(jax.random.key(5)))
    params_io.save_params(str(tmp_path / "ckpt"), params, config)
    prompts = ["The attribute reference", "A name"]
    (tmp_path / "prompts.txt").write_text("\n".join(prompts) + "\n")
    out = tmp_path / "out.jsonl"
    size = [
        f"GPTConfig.{k}={getattr(config, k)}"
        for k in (
            "vocab_size",
            "max_position_embeddings",
            "hidden_size",
            "num_layers",
            "num_heads",
            "intermediate_size",
        )
    ]
    assert (
        infer.main(
            [
                "--gin_file=gin_configs/runs/infer.gin",
                f"--gin.CHECKPOINT={tmp_path / 'ckpt'}",
                "--gin.INFER_TASK=offline_lm",
                f"--gin.infer.input_file={tmp_path / 'prompts.txt'}",
                f"--gin.infer.output_file={out}",
                "--gin.infer.model_class=@DecoderOnlyModel",
                "--gin.DecoderOnlyModel.attention='causal'",
                "--gin.infer.add_eos=False",
                "--gin.infer.task_feature_lengths={'inputs': 16, 'targets': 5}",
                *[f"--gin.{b}" for b in size],
            ]
        )
        == 0
    )
    records = [json.loads(line) for line in out.read_text().splitlines()]
    # The task's own vocabulary object, as infer reads it (a fresh OfflineVocabulary could
    # point at another cache directory if an earlier test moved it).
    vocabulary = seqio.get_mixture_or_task("offline_lm").output_features["targets"].vocabulary
    for record, prompt in zip(records, prompts):
        expected, _ = _reference_greedy(model, params, list(vocabulary.encode(prompt)), 5)
        expected = expected[: expected.index(1)] if 1 in expected else expected
        assert record["inputs"] == prompt
        assert record["prediction"] == vocabulary.decode([t for t in expected if t])
