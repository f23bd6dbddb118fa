"""The T5 paper's Table 2 architectures, each a gin file: their parameter counts and FLOPs
stand in the paper's relations (2P / P / P / P / P and M / M / M/2 / M / M), the shared model
holds exactly one stack plus cross-attention, the half-depth model half the layers, and the
hand FLOP count equals the matrix multiplies in the traced forward pass."""

import glob
import os

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like import flops, gin_setup, logs, train  # noqa: F401  (train registers its gin configurable)
from t5x_like.families.gpt.model import DecoderOnlyModel
from t5x_like.families.gpt.network import GPTConfig
from t5x_like.families.t5 import network as t5
from t5x_like.families.t5.model import EncoderDecoderModel
from t5x_like.models import base

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE2 = os.path.join(ROOT, "gin_configs/table2")
ARCHITECTURES = ("encoder_decoder", "shared", "half", "language_model", "prefix_lm")
OBJECTIVES = ("denoising", "lm")


def _model(name: str, *extra_files: str):
    """The model a Table 2 gin file (plus overrides) builds, and its task feature lengths."""
    gin.clear_config()
    gin_setup.parse_gin([os.path.join(TABLE2, f"{name}.gin"), *extra_files], [])
    model_class = gin.query_parameter("train.model_class").scoped_configurable_fn
    lengths = gin.query_parameter("Data.task_feature_lengths")
    lengths = {
        k: int(v.scoped_configurable_fn() if hasattr(v, "scoped_configurable_fn") else v)
        for k, v in lengths.items()
    }  # macros are evaluated when gin calls train
    return model_class(), lengths


def _tree(params):
    return jax.tree_util.tree_map(lambda x: x, t5.nn.meta.unbox(params))


def test_every_row_has_a_gin_file():
    found = {os.path.basename(p)[:-4] for p in glob.glob(os.path.join(TABLE2, "*_*.gin"))}
    assert found == {f"{a}_{o}" for a in ARCHITECTURES for o in OBJECTIVES}


def test_base_size_parameters_and_flops_follow_the_paper():
    """Table 2's columns at the paper's size (Base stacks, C4 vocabulary), abstractly."""
    params, cost = {}, {}
    for arch in ARCHITECTURES:
        model, lengths = _model(f"{arch}_denoising")
        params[arch] = base.count_params(model.abstract_params())
        cost[arch] = flops.forward_flops(model.config, lengths)
    lm = params["language_model"]
    # P: the 12-layer decoder-only models; 2P: the full encoder-decoder. The paper's P leaves
    # out what an encoder-decoder adds to one stack: per decoder layer a cross-attention
    # (4 d^2) and its norm (d), and the second stack's relative-position table and final norm.
    d, layers, heads, buckets = 768, 12, 12, 32
    second_stack_extras = heads * buckets + d
    assert params["prefix_lm"] == lm
    assert 1.9 < params["encoder_decoder"] / lm < 2.1
    assert params["shared"] - lm == layers * (4 * d * d + d) + second_stack_extras
    assert params["half"] - lm == layers // 2 * (4 * d * d + d) + second_stack_extras
    # M: the full and shared encoder-decoders cost the same; the half-depth one about half; the
    # decoder-only models over inputs + targets roughly M (attention is quadratic in length).
    assert cost["shared"] == cost["encoder_decoder"]
    assert 0.45 < cost["half"] / cost["encoder_decoder"] < 0.55
    assert cost["prefix_lm"] == cost["language_model"]
    assert 0.9 < cost["language_model"] / cost["encoder_decoder"] < 1.25


def test_shared_model_is_one_stack_plus_cross_attention():
    full, _ = _model("encoder_decoder_denoising", os.path.join(TABLE2, "sizes/tiny.gin"))
    shared, _ = _model("shared_denoising", os.path.join(TABLE2, "sizes/tiny.gin"))
    full_tree, shared_tree = (_tree(m.abstract_params()) for m in (full, shared))
    own = ("self_attention", "mlp", "pre_self_attention_layer_norm", "pre_mlp_layer_norm")
    expected = base.count_params(full_tree) - sum(
        base.count_params(full_tree["decoder"][layer][part])
        for layer in full_tree["decoder"]
        if layer.startswith("layers_")
        for part in own
    )
    assert base.count_params(shared_tree) == expected
    for layer in ("layers_0", "layers_1"):
        assert set(shared_tree["decoder"][layer]) == {
            "encoder_decoder_attention",
            "pre_cross_attention_layer_norm",
        }


def test_half_depth_model_has_half_the_layers():
    full, _ = _model("encoder_decoder_denoising")
    half, _ = _model("half_denoising")
    count = lambda tree, stack: sum(k.startswith("layers_") for k in tree[stack])
    full_tree, half_tree = _tree(full.abstract_params()), _tree(half.abstract_params())
    for stack in ("encoder", "decoder"):
        assert count(full_tree, stack) == 12 and count(half_tree, stack) == 6


def test_shared_model_uses_the_encoder_weights_in_the_decoder():
    """Perturbing an encoder layer's MLP changes the decoder's computation even with the
    encoder output held fixed: the decoder really runs the shared layer."""
    model, _ = _model(
        "shared_denoising",
        os.path.join(TABLE2, "sizes/tiny.gin"),
        os.path.join(TABLE2, "data/offline.gin"),
    )
    params = t5.nn.meta.unbox(model.init(jax.random.key(0)))
    encoded = jax.random.normal(jax.random.key(1), (1, 5, 64))
    tokens, dec = jnp.ones((1, 5), jnp.int32), jnp.array([[0, 4, 5]])
    decode = lambda p: model.module.apply(
        {"params": p}, encoded, tokens, dec, method=t5.Transformer.decode
    )
    changed = jax.tree_util.tree_map(lambda x: x, params)
    changed["encoder"]["layers_0"]["mlp"]["wo"]["kernel"] = (
        params["encoder"]["layers_0"]["mlp"]["wo"]["kernel"] * 2.0
    )
    assert not np.allclose(decode(params), decode(changed))


def _dot_flops(fn, *args) -> int:
    """2 x multiply-adds of every dot_general in fn's jaxpr (sub-jaxprs included)."""
    total = 0

    def visit(jaxpr):
        nonlocal total
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                lhs, rhs = (v.aval.shape for v in eqn.invars)
                (lc, _), (lb, _) = eqn.params["dimension_numbers"]
                contracted = int(np.prod([lhs[d] for d in lc]))
                out = int(np.prod(eqn.outvars[0].aval.shape))
                total += 2 * out * contracted
            for sub in jax.core.jaxprs_in_params(eqn.params):
                visit(sub)

    visit(jax.make_jaxpr(fn)(*args).jaxpr)
    return total


def test_hand_flop_count_equals_the_traced_matmuls():
    t5_cfg = t5.T5Config(
        vocab_size=96,
        emb_dim=32,
        num_heads=4,
        head_dim=8,
        mlp_dim=48,
        num_encoder_layers=2,
        num_decoder_layers=3,
        mlp_activations=("gelu", "linear"),
        logits_via_embedding=False,
    )
    model = EncoderDecoderModel(t5_cfg)
    params = t5.nn.meta.unbox(model.init(jax.random.key(0)))
    enc, dec = jnp.ones((1, 7), jnp.int32), jnp.ones((1, 5), jnp.int32)
    traced = _dot_flops(lambda p: model.module.apply({"params": p}, enc, dec), params)
    assert t5_cfg.forward_flops({"inputs": 7, "targets": 5}) == traced

    gpt_cfg = GPTConfig(
        vocab_size=96,
        max_position_embeddings=16,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        intermediate_size=48,
    )
    model = DecoderOnlyModel(gpt_cfg)
    params = t5.nn.meta.unbox(model.init(jax.random.key(0)))
    tokens = jnp.ones((1, 11), jnp.int32)
    traced = _dot_flops(lambda p: model.module.apply({"params": p}, tokens), params)
    assert flops.forward_flops(gpt_cfg, {"inputs": 6, "targets": 5}) == traced


def test_attention_flops_by_hand():
    # 2 queries, 3 keys, width 4, one head of 2: projections 2*4*2*(2*2 + 2*3) = 160,
    # scores 2 * 2 * (2*3) * 2 = 48.
    assert flops.attention_flops(2, 3, 4, 1, 2) == 208


@pytest.mark.slow  # ten short training runs
@pytest.mark.parametrize("row", [f"{a}_{o}" for a in ARCHITECTURES for o in OBJECTIVES])
def test_every_row_trains_at_tiny_size_on_the_offline_corpus(row, tmp_path):
    """Each Table 2 row's command line, at the tiny size on the offline corpus: the start-up
    line reports the model's size and FLOPs, and 20 steps lower the training loss from the
    uniform guess (ln 2048 = 7.62). One CPU device in a subprocess (faster than 8 simulated)."""
    import subprocess
    import sys

    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "t5x_like.train",
            f"--gin_file=gin_configs/table2/{row}.gin",
            "--gin_file=gin_configs/table2/sizes/tiny.gin",
            "--gin_file=gin_configs/table2/data/offline.gin",
            f"--gin.MODEL_DIR={tmp_path}",
            "--gin.TRAIN_STEPS=20",
            "--gin.BATCH_SIZE=16",
            "--gin.train.log_every=10",
            "--gin.Evaluation.loss_every=0",
            "--gin.Evaluation.num_predictions=1",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "forward FLOPs per example" in run.stdout
    losses = [
        float(line.split(" loss ")[1].split()[0])
        for line in logs.unstamped(run.stdout)
        if line.startswith("step") and " loss " in line and "eval" not in line
    ]
    assert len(losses) == 2 and losses[1] < losses[0] and losses[1] < np.log(2048), losses
