"""The published T5 sizes: each gin file's parameter count, abstractly (no allocation).

Truth comes from two independent places: transformers' PyTorch T5 built on the `meta` device
with the same dimensions, and the paper's rounded sizes (the paper calls Large ~770M; the
released checkpoint has 738M, so the nominal check allows 5%).
"""

import glob
import os

import pytest

from t5x_like.families.t5.model import EncoderDecoderModel
from t5x_like.gin_setup import load_model_config
from t5x_like.models import base
from t5x_like.models.base import count_params

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOMINAL = {
    "t5_1_0/small": 60e6,
    "t5_1_0/base": 220e6,
    "t5_1_0/large": 770e6,
    "t5_1_0/3B": 3e9,
    "t5_1_0/11B": 11e9,
    "t5_1_1/small": 77e6,
    "t5_1_1/base": 248e6,
    "t5_1_1/large": 783e6,
    "t5_1_1/xl": 2.85e9,
    "t5_1_1/xxl": 11.1e9,
}


def test_every_published_size_has_a_gin_file():
    found = {
        os.path.relpath(p, os.path.join(ROOT, "gin_configs/models"))[:-4]
        for p in glob.glob(os.path.join(ROOT, "gin_configs/models/t5_1_*/*.gin"))
    }
    assert found == set(NOMINAL)


def _hf_count(cfg) -> int:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.T5Config(
        vocab_size=cfg.vocab_size,
        d_model=cfg.emb_dim,
        d_kv=cfg.head_dim,
        d_ff=cfg.mlp_dim,
        num_layers=cfg.num_encoder_layers,
        num_decoder_layers=cfg.num_decoder_layers,
        num_heads=cfg.num_heads,
        feed_forward_proj="relu" if cfg.mlp_activations == ("relu",) else "gated-gelu",
        tie_word_embeddings=cfg.logits_via_embedding,
    )
    with torch.device("meta"):
        model = transformers.T5ForConditionalGeneration(hf_cfg)
        if not cfg.logits_via_embedding:  # transformers 5.x ties at init regardless
            model.lm_head = torch.nn.Linear(cfg.emb_dim, cfg.vocab_size, bias=False)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", sorted(NOMINAL))
def test_parameter_count(name):
    cfg = load_model_config([os.path.join(ROOT, "gin_configs/models", name + ".gin")])
    ours = count_params(EncoderDecoderModel(cfg).abstract_params())
    assert ours == _hf_count(cfg)
    assert abs(ours - NOMINAL[name]) / NOMINAL[name] < 0.05
    assert cfg.logits_via_embedding == name.startswith("t5_1_0")
    assert cfg.dropout_rate == (0.1 if name.startswith("t5_1_0") else 0.0)


BERT_COUNTS = {  # transformers' BertForPreTraining on the meta device, same dimensions
    "tiny": 4_433_468,
    "mini": 11_267_900,
    "small": 29_058_876,
    "medium": 41_668_412,
    "base": 110_106_428,
    "large": 336_226_108,
}
BERT_NOMINAL = {"base": 110e6, "large": 340e6}  # the BERT paper's rounded sizes


@pytest.mark.parametrize("name", sorted(BERT_COUNTS))
def test_bert_parameter_count(name):
    import jax
    import jax.numpy as jnp

    from t5x_like.families.bert import network as bert

    path = os.path.join(ROOT, "gin_configs/models/bert", name + ".gin")
    cfg = load_model_config([path], config_class=bert.BertConfig)
    shapes = jax.eval_shape(
        lambda: bert.BertForPreTraining(cfg).init(jax.random.key(0), jnp.ones((1, 8), jnp.int32))
    )["params"]
    count = base.count_params(shapes)
    assert count == BERT_COUNTS[name]
    with open(path) as f:
        assert f"{count:,} parameters" in f.readline()
    if name in BERT_NOMINAL:
        assert abs(count - BERT_NOMINAL[name]) / BERT_NOMINAL[name] < 0.02
