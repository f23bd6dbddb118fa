"""The decoder-only model equals randomly initialised transformers OpenAI GPT (post-LN) and
GPT-2 (pre-LN) models (logits <= 1e-4, float32), exports back to the same tensors, and its
prefix-LM mask on a packed row is the hand-written matrix."""

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from t5x_like.families.gpt import hf as hf_gpt  # noqa: E402
from t5x_like.families.gpt import model as decoder_only  # noqa: E402
from t5x_like.families.gpt import network as gpt_network  # noqa: E402
from t5x_like.models import base  # noqa: E402

SIZES = dict(vocab_size=61, n_positions=24, n_embd=32, n_layer=2, n_head=4)
MODELS = {
    "openai-gpt": (transformers.OpenAIGPTConfig, transformers.OpenAIGPTLMHeadModel),
    "gpt2": (transformers.GPT2Config, transformers.GPT2LMHeadModel),
}


def _reference(family):
    config_cls, model_cls = MODELS[family]
    torch.manual_seed(0)
    extra = {"bos_token_id": 0, "eos_token_id": 0} if family == "gpt2" else {}
    model = model_cls(config_cls(**SIZES, **extra)).eval()
    with torch.no_grad():  # non-trivial LayerNorm and bias values
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("family", list(MODELS))
def test_logits_match_transformers_and_export_back(family):
    model = _reference(family)
    cfg = hf_gpt.config_from_hf(model.config.to_dict())
    assert cfg.pre_layer_norm == (family == "gpt2")
    tensors = {k: v.numpy() for k, v in model.state_dict().items()}
    params = hf_gpt.params_from_hf(tensors, cfg)
    ids = np.random.default_rng(0).integers(0, SIZES["vocab_size"], (3, 17))
    with torch.no_grad():
        ref = model(torch.tensor(ids)).logits.numpy()
    ours = gpt_network.DecoderOnly(cfg).apply({"params": params}, jnp.asarray(ids))
    np.testing.assert_allclose(np.asarray(ours), ref, atol=1e-4, rtol=1e-4)
    exported = hf_gpt.params_to_hf(params, cfg)
    assert sorted(exported) == sorted(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(exported[name], value, err_msg=name)
    assert hf_gpt.hf_config(cfg)["model_type"] == family


def test_prefix_lm_mask_on_a_packed_row():
    # Two packed examples: [p p t t] [p t t] then padding; p = input prefix, t = targets.
    tokens = jnp.array([[5, 6, 7, 8, 9, 10, 11, 0]])
    segments = jnp.array([[1, 1, 1, 1, 2, 2, 2, 0]])
    prefix = jnp.array([[1, 1, 0, 0, 1, 0, 0, 0]])
    mask = np.asarray(gpt_network.decoder_mask(tokens, segments, prefix))[0, 0].astype(int)
    want = np.array(
        [
            # keys: 0 1 2 3 4 5 6 7
            [1, 1, 0, 0, 0, 0, 0, 0],  # prefix sees the whole prefix of its example
            [1, 1, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0, 0],  # targets: causal
            [1, 1, 1, 1, 0, 0, 0, 0],
            [0, 0, 0, 0, 1, 0, 0, 0],  # second example: never the first's tokens
            [0, 0, 0, 0, 1, 1, 0, 0],
            [0, 0, 0, 0, 1, 1, 1, 0],
            [0, 0, 0, 0, 0, 0, 0, 1],  # padding sees only padding (it has zero loss weight)
        ]
    )
    np.testing.assert_array_equal(mask, want)


@pytest.mark.parametrize("family", list(MODELS))
def test_convert_verifies_imports_and_exports_gpt(family, tmp_path, capsys):
    from t5x_like import convert

    model = _reference(family)
    model.save_pretrained(tmp_path / "hf")
    assert (
        convert.main(
            ["--from_hf", str(tmp_path / "hf"), "--to", str(tmp_path / "ckpt"), "--verify"]
        )
        == 0
    )
    out = capsys.readouterr().out
    diff = float(out.split("max_abs_logit_diff=")[1].split()[0])
    assert diff <= 1e-4
    assert (
        convert.main(["--from_ckpt", str(tmp_path / "ckpt"), "--to_hf", str(tmp_path / "back")])
        == 0
    )
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "back")).eval()
    ids = torch.tensor(np.random.default_rng(1).integers(0, SIZES["vocab_size"], (2, 9)))
    with torch.no_grad():
        np.testing.assert_allclose(
            reloaded(ids).logits.numpy(), model(ids).logits.numpy(), atol=1e-6
        )


def test_gpt2_residual_projections_start_scaled_down():
    """GPT-2 initialises each residual block's output projection with std 0.02 / sqrt(2N);
    every other weight keeps 0.02 (65k draws per matrix: the estimate is within ~1%)."""
    import jax

    from t5x_like.families.t5 import network as t5

    cfg = gpt_network.GPTConfig(
        vocab_size=512,
        max_position_embeddings=64,
        hidden_size=256,
        num_layers=8,
        num_heads=4,
        intermediate_size=256,
        pre_layer_norm=True,
        activation="gelu",
        scale_residual_init=True,
    )
    params = t5.nn.meta.unbox(decoder_only.DecoderOnlyModel(cfg).init(jax.random.key(0)))
    scaled = 0.02 / np.sqrt(2 * 8)
    layer = params["layers_3"]
    np.testing.assert_allclose(np.std(layer["attention"]["out"]["kernel"]), scaled, rtol=0.02)
    np.testing.assert_allclose(np.std(layer["mlp"]["wo"]["kernel"]), scaled, rtol=0.02)
    np.testing.assert_allclose(np.std(layer["attention"]["query"]["kernel"]), 0.02, rtol=0.02)
    np.testing.assert_allclose(np.std(layer["mlp"]["wi"]["kernel"]), 0.02, rtol=0.02)


@pytest.mark.parametrize("name,family", [("gpt1", "openai-gpt"), ("gpt2", "gpt2")])
def test_published_sizes_match_transformers(name, family):
    """gin_configs/models/gpt/{gpt1,gpt2}.gin have exactly the parameters of transformers'
    `openai-gpt` (116.5M) and `gpt2` (124.4M) models of the same configuration."""
    import os

    from t5x_like.gin_setup import load_model_config

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = load_model_config(
        [os.path.join(root, f"gin_configs/models/gpt/{name}.gin")],
        config_class=gpt_network.GPTConfig,
    )
    ours = base.count_params(decoder_only.DecoderOnlyModel(cfg).abstract_params())
    config_cls, model_cls = MODELS[family]
    with torch.device("meta"):
        reference = model_cls(config_cls(**hf_gpt.hf_config(cfg)))
    assert ours == sum(p.numel() for p in reference.parameters())  # tied: counted once


def test_t5_style_language_model_refuses_a_transformers_export():
    from t5x_like.families.gpt import hf as hf_gpt
    from t5x_like.families.gpt.network import GPTConfig

    with pytest.raises(hf_gpt.CheckpointError, match="no equivalent"):
        hf_gpt.hf_config(
            GPTConfig(norm="rms_norm", position_encoding="relative", pre_layer_norm=True)
        )


def test_openai_gpt_gelu_is_the_tanh_approximation():
    """transformers' OpenAI GPT maps afn='gelu' to the tanh GELU (its ACT_FNS: gelu_new), as
    OpenAI's train.py computes it; GPT-2's 'gelu' is the exact one. Feed-forward inputs of
    order 1, an output layer that passes them on and logits of order 1 (c_fc, the MLP's c_proj
    and the tied embedding scaled up) make the two differ far beyond the tolerance, so the
    import must pick the right one to match."""
    import dataclasses

    model = _reference("openai-gpt")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("mlp.c_fc.weight", "mlp.c_proj.weight")):
                p.mul_(40.0)
            if name.endswith("tokens_embed.weight"):
                p.mul_(20.0)
    cfg = hf_gpt.config_from_hf(model.config.to_dict())
    assert cfg.activation == "gelu"
    params = hf_gpt.params_from_hf({k: v.numpy() for k, v in model.state_dict().items()}, cfg)
    ids = np.random.default_rng(1).integers(0, SIZES["vocab_size"], (2, 13))
    with torch.no_grad():
        ref = model(torch.tensor(ids)).logits.numpy()
    ours = gpt_network.DecoderOnly(cfg).apply({"params": params}, jnp.asarray(ids))
    np.testing.assert_allclose(np.asarray(ours), ref, atol=1e-4, rtol=1e-4)
    exact = dataclasses.replace(cfg, activation="gelu_exact")
    wrong = gpt_network.DecoderOnly(exact).apply({"params": params}, jnp.asarray(ids))
    assert np.max(np.abs(np.asarray(wrong) - ref)) > 1e-3
