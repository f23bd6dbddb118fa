"""Parity with transformers' PyTorch T5 and the checkpoint importer's error messages.

The reference models are randomly initialised (no downloads); the v1.1 one has its `lm_head`
untied explicitly because transformers 5.x ties it at init even with tie_word_embeddings=False.
"""

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.numpy import load_file, save_file  # noqa: E402

from t5x_like import convert  # noqa: E402
from t5x_like.checkpoints import params_io  # noqa: E402
from t5x_like.families.t5 import hf as hf_t5  # noqa: E402
from t5x_like.families.t5.model import EncoderDecoderModel  # noqa: E402
from t5x_like.models.base import unbox  # noqa: E402

VARIANTS = {
    "v1_0_relu_tied": dict(feed_forward_proj="relu", tie_word_embeddings=True),
    "v1_1_gated_gelu_untied": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False),
}


def _make_hf_checkpoint(directory, variant: str, seed: int = 0):
    cfg = transformers.T5Config(
        vocab_size=128,
        d_model=48,
        d_kv=12,
        d_ff=96,
        num_layers=2,
        num_decoder_layers=3,
        num_heads=4,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        dropout_rate=0.0,
        decoder_start_token_id=0,
        **VARIANTS[variant],
    )
    torch.manual_seed(seed)
    model = transformers.T5ForConditionalGeneration(cfg)
    if not VARIANTS[variant]["tie_word_embeddings"]:
        model.lm_head = torch.nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        torch.nn.init.normal_(model.lm_head.weight, std=cfg.d_model**-0.5)
    # Random init leaves layer norm scales at 1; perturb them so the test sees them.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.eval()
    model.save_pretrained(str(directory))
    return model


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def hf_checkpoint(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    model = _make_hf_checkpoint(directory, request.param)
    return request.param, directory, model


def test_logits_match_reference(hf_checkpoint):
    variant, directory, hf_model = hf_checkpoint
    config, params = hf_t5.load_hf_checkpoint(str(directory))
    assert config.num_encoder_layers == 2 and config.num_decoder_layers == 3
    assert config.logits_via_embedding == (variant == "v1_0_relu_tied")
    for seed in range(2):
        batch = hf_t5.example_batch(
            config.vocab_size, batch_size=3, input_len=20, target_len=11, seed=seed
        )
        diffs = hf_t5.max_abs_differences(hf_model, config, params, batch)
        assert diffs["encoder"] <= 1e-4, diffs
        assert diffs["logit"] <= 1e-4, diffs


def test_verification_detects_a_wrong_parameter(hf_checkpoint):
    _, directory, hf_model = hf_checkpoint
    config, params = hf_t5.load_hf_checkpoint(str(directory))
    params["decoder"]["layers_1"]["mlp"]["wo"]["kernel"] = (
        params["decoder"]["layers_1"]["mlp"]["wo"]["kernel"] * 1.01
    )
    diffs = hf_t5.max_abs_differences(
        hf_model, config, params, hf_t5.example_batch(config.vocab_size)
    )
    assert diffs["logit"] > 1e-4


def test_convert_cli_verifies_and_writes_a_restorable_checkpoint(hf_checkpoint, tmp_path, capsys):
    _, directory, _ = hf_checkpoint
    out = tmp_path / "ckpt"
    assert convert.main(["--from_hf", str(directory), "--to", str(out), "--verify"]) == 0
    printed = capsys.readouterr().out
    diff = float(printed.split("max_abs_logit_diff=")[1].split()[0])
    assert diff <= 1e-4
    config, params = hf_t5.load_hf_checkpoint(str(directory))
    assert params_io.restore_config(str(out)) == config
    abstract = unbox(EncoderDecoderModel(config).abstract_params())
    restored = params_io.restore_params(str(out), abstract)
    np.testing.assert_array_equal(
        restored["token_embedder"]["embedding"], params["token_embedder"]["embedding"]
    )


def test_scanned_round_trip_back_to_transformers(hf_checkpoint, tmp_path, capsys):
    """HF -> our scanned layout -> per-layer -> HF again: transformers loads the export as the
    same model, every tensor equal (the untied v1.1 output layer stays untied)."""
    _, directory, hf_model = hf_checkpoint
    scanned, per_layer, back = tmp_path / "scanned", tmp_path / "per_layer", tmp_path / "hf"
    assert (
        convert.main(["--from_hf", str(directory), "--to", str(scanned), "--layout", "scanned"])
        == 0
    )
    assert params_io.restore_config(str(scanned)).scan_layers
    saved = params_io.restore_saved_params(str(scanned))
    assert "layers" in saved["encoder"] and "layers_0" not in saved["encoder"]
    assert (
        convert.main(["--from_ckpt", str(scanned), "--to", str(per_layer), "--layout", "per_layer"])
        == 0
    )
    assert not params_io.restore_config(str(per_layer)).scan_layers
    for source in (scanned, per_layer):
        assert convert.main(["--from_ckpt", str(source), "--to_hf", str(back)]) == 0
        reloaded = transformers.T5ForConditionalGeneration.from_pretrained(str(back))
        want = hf_model.state_dict()
        got = reloaded.state_dict()
        assert set(got) == set(want)
        for name, tensor in want.items():
            np.testing.assert_array_equal(got[name].numpy(), tensor.numpy(), err_msg=name)


# ------------------------------------------------------------------- bad checkpoints
@pytest.fixture()
def editable_checkpoint(tmp_path):
    _make_hf_checkpoint(tmp_path, "v1_1_gated_gelu_untied")
    return tmp_path


def _rewrite(directory, edit):
    path = os.path.join(directory, "model.safetensors")
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def test_missing_tensor_is_named(editable_checkpoint):
    _rewrite(
        editable_checkpoint, lambda t: t.pop("decoder.block.2.layer.1.EncDecAttention.k.weight")
    )
    with pytest.raises(
        hf_t5.CheckpointError,
        match=r"Missing.*decoder\.block\.2\.layer\.1\.EncDecAttention\.k\.weight",
    ):
        hf_t5.load_hf_checkpoint(str(editable_checkpoint))


def test_missing_untied_lm_head_is_named(editable_checkpoint):
    _rewrite(editable_checkpoint, lambda t: t.pop("lm_head.weight"))
    with pytest.raises(hf_t5.CheckpointError, match=r"Missing.*lm_head\.weight"):
        hf_t5.load_hf_checkpoint(str(editable_checkpoint))


def test_unknown_tensor_is_named(editable_checkpoint):
    _rewrite(
        editable_checkpoint,
        lambda t: t.update(
            {"encoder.block.7.layer.0.SelfAttention.q.weight": np.zeros((48, 48), np.float32)}
        ),
    )
    with pytest.raises(
        hf_t5.CheckpointError,
        match=r"Unknown.*encoder\.block\.7\.layer\.0\.SelfAttention\.q\.weight",
    ):
        hf_t5.load_hf_checkpoint(str(editable_checkpoint))


def test_wrong_shape_is_named(editable_checkpoint):
    config_path = editable_checkpoint / "config.json"
    cfg = json.loads(config_path.read_text())
    cfg["d_ff"] = 64
    config_path.write_text(json.dumps(cfg))
    with pytest.raises(
        hf_t5.CheckpointError,
        match=r"Tensor encoder\.block\.0\.layer\.1\."
        r"DenseReluDense\.wi_0\.weight gives shape",
    ):
        hf_t5.load_hf_checkpoint(str(editable_checkpoint))


def test_cli_reports_errors_without_writing(editable_checkpoint, tmp_path, capsys):
    _rewrite(editable_checkpoint, lambda t: t.pop("shared.weight"))
    out = tmp_path / "never"
    assert convert.main(["--from_hf", str(editable_checkpoint), "--to", str(out)]) == 2
    assert "shared.weight" in capsys.readouterr().err
    assert not out.exists()


def test_sharded_bfloat16_checkpoint(tmp_path):
    """A sharded safetensors checkpoint in bfloat16 imports to the same values in float32."""
    model = _make_hf_checkpoint(tmp_path / "fp32", "v1_1_gated_gelu_untied")
    model.to(torch.bfloat16).save_pretrained(str(tmp_path / "bf16"), max_shard_size="50KB")
    assert (tmp_path / "bf16" / "model.safetensors.index.json").exists()
    _, params = hf_t5.load_hf_checkpoint(str(tmp_path / "bf16"))
    expected = model.lm_head.weight.detach().float().numpy().T  # the bf16 values, widened
    got = params["decoder"]["logits_dense"]["kernel"]
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)
