"""BERT's fine-tuning heads equal transformers' (BertForSequenceClassification,
BertForMultipleChoice, BertForQuestionAnswering, BertForTokenClassification; randomly
initialised, float32, <= 1e-4), import from and export to their HF layouts, and their losses
match hand-computed values; the feature-based tagger sees exactly the last four layers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from t5x_like.families.bert import hf as hf_bert  # noqa: E402
from t5x_like.families.bert import model as bert_models  # noqa: E402
from t5x_like.families.bert import network as bert  # noqa: E402

HF_CONFIG = dict(
    vocab_size=97,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=32,
    type_vocab_size=2,
)


def _hf(cls, **extra):
    torch.manual_seed(0)
    model = cls(transformers.BertConfig(**HF_CONFIG, **extra)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                p.add_(0.1 * torch.randn_like(p))
    tensors = {k: v.numpy() for k, v in model.state_dict().items()}
    return model, tensors


def _inputs(batch=3, length=10, seed=1):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, HF_CONFIG["vocab_size"], (batch, length))
    ids[0, -3:] = 0
    segments = np.zeros_like(ids)
    segments[:, length // 2 :] = 1
    return ids, segments, (ids != 0).astype(np.int64)


def _torch(*arrays):
    return [torch.tensor(a) for a in arrays]


CASES = {
    "sequence_classification": (
        transformers.BertForSequenceClassification,
        {"num_labels": 3},
        lambda cfg: bert.BertForSequenceClassification(cfg, 3),
    ),
    "token_classification": (
        transformers.BertForTokenClassification,
        {"num_labels": 5},
        lambda cfg: bert.BertForTokenClassification(cfg, 5),
    ),
    "question_answering": (
        transformers.BertForQuestionAnswering,
        {},
        lambda cfg: bert.BertForQuestionAnswering(cfg),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_heads_match_transformers_and_export_back(case):
    hf_cls, extra, ours = CASES[case]
    model, tensors = _hf(hf_cls, **extra)
    cfg = hf_bert.config_from_hf(model.config.to_dict())
    params = hf_bert.params_from_hf(tensors, cfg)
    ids, segments, mask = _inputs()
    with torch.no_grad():
        ref = model(
            *_torch(ids), token_type_ids=torch.tensor(segments), attention_mask=torch.tensor(mask)
        )
    out = ours(cfg).apply(
        {"params": params}, jnp.asarray(ids), jnp.asarray(segments), jnp.asarray(mask)
    )
    if case == "question_answering":
        np.testing.assert_allclose(out[0], ref.start_logits.numpy(), atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(out[1], ref.end_logits.numpy(), atol=1e-4, rtol=1e-4)
    else:
        np.testing.assert_allclose(out, ref.logits.numpy(), atol=1e-4, rtol=1e-4)
    exported = hf_bert.params_to_hf(params, cfg, hf_cls.__name__)
    tensors.pop("bert.embeddings.position_ids", None)
    assert sorted(exported) == sorted(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(exported[name], value, err_msg=name)


def test_multiple_choice_matches_transformers():
    model, tensors = _hf(transformers.BertForMultipleChoice)
    cfg = hf_bert.config_from_hf(model.config.to_dict())
    params = hf_bert.params_from_hf(tensors, cfg)
    ids, segments, mask = (x.reshape(2, 3, 5) for x in _inputs(batch=6, length=5))
    with torch.no_grad():
        ref = model(
            *_torch(ids), token_type_ids=torch.tensor(segments), attention_mask=torch.tensor(mask)
        ).logits.numpy()
    out = bert.BertForMultipleChoice(cfg).apply(
        {"params": params}, jnp.asarray(ids), jnp.asarray(segments), jnp.asarray(mask)
    )
    assert out.shape == (2, 3)
    np.testing.assert_allclose(out, ref, atol=1e-4, rtol=1e-4)


def test_saved_classifier_reloads_in_transformers(tmp_path):
    model, tensors = _hf(transformers.BertForSequenceClassification, num_labels=2)
    cfg = hf_bert.config_from_hf(model.config.to_dict())
    params = hf_bert.params_from_hf(tensors, cfg)
    arch = hf_bert.save_hf_checkpoint(str(tmp_path / "hf"), params, cfg)
    assert arch == "BertForSequenceClassification"
    reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(
        str(tmp_path / "hf")
    ).eval()
    ids, segments, mask = _inputs()
    with torch.no_grad():
        a = model(*_torch(ids), attention_mask=torch.tensor(mask)).logits.numpy()
        b = reloaded(*_torch(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    np.testing.assert_allclose(a, b, atol=1e-6)


# ---------------------------------------------------------------------------- losses
TINY = bert.BertConfig(
    vocab_size=50,
    hidden_size=16,
    num_layers=1,
    num_heads=2,
    intermediate_size=32,
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
)


def _log_softmax(x):
    x = np.asarray(x, np.float64)
    return (
        x
        - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))
        - x.max(-1, keepdims=True)
    )


def test_multiple_choice_loss_is_softmax_over_choices():
    model = bert_models.BertMultipleChoiceModel(TINY, num_choices=4)
    params = jax.device_get(nn_unbox(jax.jit(model.init)(jax.random.key(0))))
    rng = np.random.default_rng(0)
    batch = {
        "input_ids": rng.integers(1, 50, (3, 4, 6)).astype(np.int32),
        "segment_ids": np.zeros((3, 4, 6), np.int32),
        "input_mask": np.ones((3, 4, 6), np.int32),
        "label": np.array([0, 3, 1], np.float32),
        "label_weights": np.ones(3, np.float32),
    }
    scores = np.asarray(jax.jit(model.apply)(params, batch))
    want = -np.mean(_log_softmax(scores)[np.arange(3), [0, 3, 1]])
    sums = jax.jit(model.loss_sums)(params, batch)
    got = float(sums["loss_sum"] / model.loss_denominators(batch)["loss_sum"])
    assert got == pytest.approx(want, rel=1e-5)


def test_span_loss_is_the_mean_of_start_and_end_cross_entropies():
    model = bert_models.BertSpanModel(TINY)
    params = jax.device_get(nn_unbox(jax.jit(model.init)(jax.random.key(0))))
    rng = np.random.default_rng(0)
    batch = {
        "input_ids": rng.integers(1, 50, (2, 8)).astype(np.int32),
        "segment_ids": np.zeros((2, 8), np.int32),
        "input_mask": np.ones((2, 8), np.int32),
        "start_position": np.array([3, 0], np.int32),
        "end_position": np.array([5, 0], np.int32),
        "label_weights": np.array([1.0, 1.0], np.float32),
    }
    start, end = (np.asarray(x) for x in jax.jit(model.apply)(params, batch))
    want = np.mean(
        [
            -(_log_softmax(start)[0, 3] + _log_softmax(end)[0, 5]) / 2,
            -(_log_softmax(start)[1, 0] + _log_softmax(end)[1, 0]) / 2,
        ]
    )
    sums = jax.jit(model.loss_sums)(params, batch)
    got = float(sums["loss_sum"] / model.loss_denominators(batch)["loss_sum"])
    assert got == pytest.approx(want, rel=1e-5)


def test_regression_head_uses_squared_error_and_padding_rows_do_not_count():
    model = bert_models.BertClassifierModel(TINY, num_labels=1)
    params = jax.device_get(nn_unbox(jax.jit(model.init)(jax.random.key(0))))
    rng = np.random.default_rng(0)
    batch = {
        "input_ids": rng.integers(1, 50, (3, 6)).astype(np.int32),
        "segment_ids": np.zeros((3, 6), np.int32),
        "input_mask": np.ones((3, 6), np.int32),
        "label": np.array([4.2, 0.5, 9.0], np.float32),
        "label_weights": np.array([1.0, 1.0, 0.0], np.float32),
    }
    predicted = np.asarray(jax.jit(model.predict)(params, batch))
    want = np.mean((predicted[:2] - batch["label"][:2]) ** 2)
    sums = jax.jit(model.loss_sums)(params, batch)
    got = float(sums["loss_sum"] / model.loss_denominators(batch)["loss_sum"])
    assert got == pytest.approx(want, rel=1e-5)


def test_feature_based_tagger_reads_the_last_four_layers_concatenated():
    cfg = bert.BertConfig(**{**TINY.__dict__, "num_layers": 5})
    module = bert.BertForTokenClassification(cfg, 3, feature_based=True, lstm_size=8)
    ids = jnp.asarray(np.random.default_rng(0).integers(1, 50, (2, 7)), jnp.int32)
    params = nn_unbox(jax.eval_shape(module.init, jax.random.key(0), ids)["params"])
    layers = jax.eval_shape(
        lambda p: bert.BertEncoder(cfg).apply({"params": p}, ids, return_all_layers=True),
        params["encoder"],
    )[2]
    assert len(layers) == 5
    # The first BiLSTM's input width is 4 x hidden: the last four layers side by side.
    kernels = [x.shape for x in jax.tree_util.tree_leaves(params["bilstm_0"])]
    assert (4 * cfg.hidden_size, 4) in kernels
    # (That the encoder stays frozen in training: test_bert_training.)


def nn_unbox(tree):
    import flax.linen as nn

    return nn.meta.unbox(tree)
