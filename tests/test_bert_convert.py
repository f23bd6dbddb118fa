"""BERT checkpoints through `python -m t5x_like.convert`: import from HuggingFace (safetensors
and weights-only .bin) with --verify, and export back to a directory transformers loads with
identical outputs."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from t5x_like import convert  # noqa: E402
from t5x_like.checkpoints import params_io  # noqa: E402
from t5x_like.families.bert.network import BertConfig  # noqa: E402

HF = dict(
    vocab_size=120,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=32,
)


def _save_reference(path, safe=True):
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(transformers.BertConfig(**HF)).eval()
    model.save_pretrained(str(path), safe_serialization=safe)
    return model


def _logits(model, ids):
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids))
    return out.prediction_logits.numpy(), out.seq_relationship_logits.numpy()


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "pytorch_bin"])
def test_import_verify_export_round_trip(tmp_path, capsys, safe):
    reference = _save_reference(tmp_path / "hf", safe)
    assert (
        convert.main(
            ["--from_hf", str(tmp_path / "hf"), "--to", str(tmp_path / "ours"), "--verify"]
        )
        == 0
    )
    out = capsys.readouterr().out
    diff = float(out.split("max_abs_logit_diff=")[1].split()[0])
    assert diff < 1e-4
    assert isinstance(params_io.restore_config(str(tmp_path / "ours")), BertConfig)
    assert (
        convert.main(["--from_ckpt", str(tmp_path / "ours"), "--to_hf", str(tmp_path / "exported")])
        == 0
    )
    assert json.loads((tmp_path / "exported" / "config.json").read_text())["model_type"] == "bert"
    exported = transformers.BertForPreTraining.from_pretrained(
        str(tmp_path / "exported"), local_files_only=True
    ).eval()
    ids = np.random.default_rng(0).integers(1, 120, (2, 10))
    for got, want in zip(_logits(exported, ids), _logits(reference, ids)):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_mismatched_tensor_is_refused(tmp_path, capsys):
    _save_reference(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["intermediate_size"] = 48
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    assert convert.main(["--from_hf", str(tmp_path / "hf"), "--to", str(tmp_path / "o")]) == 2
    assert "intermediate.dense.weight gives shape" in capsys.readouterr().err


def test_scanned_layout_runs_the_reference_model_and_exports_back(tmp_path):
    """HF -> our scanned layout: the scanned model (one `nn.scan` over the layers, remat
    'dots') gives transformers' logits on the imported weights, and the scanned checkpoint
    exports back to the same tensors."""
    import dataclasses

    from t5x_like.families.bert.model import BertPretrainingModel

    reference = _save_reference(tmp_path / "hf")
    assert (
        convert.main(
            [
                "--from_hf",
                str(tmp_path / "hf"),
                "--to",
                str(tmp_path / "scanned"),
                "--layout",
                "scanned",
            ]
        )
        == 0
    )
    config = params_io.restore_config(str(tmp_path / "scanned"))
    assert config.scan_layers
    params = params_io.restore_saved_params(str(tmp_path / "scanned"))
    assert "layers" in params["encoder"] and "layers_0" not in params["encoder"]
    assert params["encoder"]["layers"]["mlp"]["wi"]["kernel"].shape[0] == HF["num_hidden_layers"]

    model = BertPretrainingModel(dataclasses.replace(config, remat_policy="dots"))
    ids = np.random.default_rng(0).integers(1, 120, (2, 10))
    out = model.apply(params, {"input_ids": ids})
    want_mlm, want_nsp = _logits(reference, ids)
    np.testing.assert_allclose(out["mlm_logits"], want_mlm, atol=1e-4)
    np.testing.assert_allclose(out["nsp_logits"], want_nsp, atol=1e-4)

    assert (
        convert.main(
            ["--from_ckpt", str(tmp_path / "scanned"), "--to_hf", str(tmp_path / "exported")]
        )
        == 0
    )
    exported = transformers.BertForPreTraining.from_pretrained(
        str(tmp_path / "exported"), local_files_only=True
    )
    want, got = reference.state_dict(), exported.state_dict()
    assert set(got) == set(want)
    for name, tensor in got.items():
        np.testing.assert_array_equal(tensor.numpy(), want[name].numpy(), err_msg=name)


def test_import_and_export_through_a_bucket(tmp_path):
    """--from_hf and --to_hf on a bucket path go through the storage layer (TensorFlow's
    `ram://` file system stands in for gs:// here): the export read back from the bucket loads
    in transformers with the reference's logits, and the tokenizer comes along both ways."""
    import uuid

    from t5x_like import storage

    reference = _save_reference(tmp_path / "hf")
    (tmp_path / "hf" / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(115)])
    )
    bucket = f"ram://t5x_like_test/{uuid.uuid4().hex}"
    storage.copy_tree(str(tmp_path / "hf"), f"{bucket}/hf")
    assert convert.main(["--from_hf", f"{bucket}/hf", "--to", str(tmp_path / "ours")]) == 0
    assert (tmp_path / "ours" / "tokenizer" / "vocab.txt").exists()
    assert convert.main(["--from_ckpt", str(tmp_path / "ours"), "--to_hf", f"{bucket}/out"]) == 0
    assert {"config.json", "model.safetensors", "vocab.txt"} <= set(
        storage.listdir(f"{bucket}/out")
    )
    storage.copy_tree(f"{bucket}/out", str(tmp_path / "back"))
    exported = transformers.BertForPreTraining.from_pretrained(
        str(tmp_path / "back"), local_files_only=True
    ).eval()
    ids = np.random.default_rng(1).integers(1, 120, (2, 10))
    for got, want in zip(_logits(exported, ids), _logits(reference, ids)):
        np.testing.assert_allclose(got, want, atol=1e-5)
