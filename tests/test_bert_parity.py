"""BERT equals randomly initialised HuggingFace BERT models (MLM logits, NSP logits, pooled
output) in float32, and the HF mapping exports back to the same tensors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from t5x_like.families.bert import hf as hf_bert  # noqa: E402
from t5x_like.families.bert import network as bert  # noqa: E402
from t5x_like.models import base  # noqa: E402

CONFIGS = {
    "tiny": dict(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
        type_vocab_size=2,
    ),
    "wide_heads": dict(
        vocab_size=211,
        hidden_size=48,
        num_hidden_layers=3,
        num_attention_heads=3,
        intermediate_size=96,
        max_position_embeddings=40,
        type_vocab_size=3,
    ),
}


def _reference(name):
    torch.manual_seed(0)
    hf_cfg = transformers.BertConfig(**CONFIGS[name])
    model = transformers.BertForPreTraining(hf_cfg).eval()
    # Non-trivial LayerNorm and bias values, so a mapping mistake cannot hide behind 1s and 0s.
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("bias") or "LayerNorm" in pname:
                p.add_(0.1 * torch.randn_like(p))
    return hf_cfg, model


def _inputs(cfg, batch=3, length=11):
    rng = np.random.default_rng(1)
    ids = rng.integers(1, cfg.vocab_size, (batch, length))
    ids[0, -4:] = 0  # padding
    segments = np.zeros_like(ids)
    segments[:, length // 2 :] = 1
    mask = (ids != 0).astype(np.int64)
    return ids, segments, mask


@pytest.mark.parametrize("name", list(CONFIGS))
def test_outputs_match_transformers(name):
    hf_cfg, model = _reference(name)
    cfg = hf_bert.config_from_hf(hf_cfg.to_dict())
    tensors = {k: v.numpy() for k, v in model.state_dict().items()}
    params = hf_bert.params_from_hf(tensors, cfg)
    ids, segments, mask = _inputs(cfg)
    with torch.no_grad():
        ref = model(
            input_ids=torch.tensor(ids),
            token_type_ids=torch.tensor(segments),
            attention_mask=torch.tensor(mask),
            output_hidden_states=True,
        )
        pooled_ref = model.bert(
            input_ids=torch.tensor(ids),
            token_type_ids=torch.tensor(segments),
            attention_mask=torch.tensor(mask),
        ).pooler_output.numpy()
    out = bert.BertForPreTraining(cfg).apply(
        {"params": params}, jnp.asarray(ids), jnp.asarray(segments), jnp.asarray(mask)
    )
    valid = mask.astype(bool)
    np.testing.assert_allclose(
        np.asarray(out["mlm_logits"])[valid],
        ref.prediction_logits.numpy()[valid],
        atol=1e-4,
        rtol=1e-4,
    )
    np.testing.assert_allclose(
        out["nsp_logits"], ref.seq_relationship_logits.numpy(), atol=1e-4, rtol=1e-4
    )
    np.testing.assert_allclose(out["pooled"], pooled_ref, atol=1e-4, rtol=1e-4)
    n_ref = sum(p.numel() for p in model.parameters())
    assert base.count_params(params) == n_ref


def test_export_round_trip_and_bare_bert_model():
    hf_cfg, model = _reference("tiny")
    cfg = hf_bert.config_from_hf(hf_cfg.to_dict())
    tensors = {k: v.numpy() for k, v in model.state_dict().items()}
    exported = hf_bert.params_to_hf(hf_bert.params_from_hf(tensors, cfg), cfg)
    assert set(exported) == set(tensors) - {"bert.embeddings.position_ids"}
    for key, value in exported.items():
        np.testing.assert_array_equal(value, tensors[key], err_msg=key)
    # A bare BertModel (no heads, no 'bert.' prefix) gives the encoder only.
    bare = {k[len("bert.") :]: v for k, v in tensors.items() if k.startswith("bert.")}
    params = hf_bert.params_from_hf(bare, cfg)
    assert set(params) == {"encoder"}


def test_wrong_or_missing_tensors_are_named():
    hf_cfg, model = _reference("tiny")
    cfg = hf_bert.config_from_hf(hf_cfg.to_dict())
    tensors = {k: v.numpy() for k, v in model.state_dict().items()}
    broken = dict(tensors)
    del broken["bert.encoder.layer.1.output.dense.bias"]
    with pytest.raises(hf_bert.CheckpointError, match="layer.1.output.dense.bias is missing"):
        hf_bert.params_from_hf(broken, cfg)
    extra = {**tensors, "bert.encoder.layer.9.extra": np.zeros(3)}
    with pytest.raises(hf_bert.CheckpointError, match="Unexpected tensors"):
        hf_bert.params_from_hf(extra, cfg)


def test_partitioning_rules_cover_bert():
    from t5x_like import partitioning

    cfg = bert.BertConfig(
        vocab_size=128,
        hidden_size=32,
        num_layers=1,
        num_heads=4,
        intermediate_size=64,
        max_position_embeddings=16,
    )
    boxed = jax.eval_shape(
        lambda: bert.BertForPreTraining(cfg).init(jax.random.key(0), jnp.ones((2, 8), jnp.int32))
    )["params"]
    mesh = partitioning.make_mesh(mesh_shape=(2, 4))
    shardings = partitioning.param_shardings(boxed, mesh, partitioning.LAYOUTS["fsdp"])
    wi = shardings["encoder"]["layers_0"]["mlp"]["wi"]["kernel"]
    assert tuple(wi.spec) == ("data", "model")
