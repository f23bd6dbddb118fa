import os
import subprocess
import sys
import textwrap

import pytest

from t5x_like.config import quote_plain_string
from t5x_like.families.t5.network import T5Config
from t5x_like.gin_setup import bind_over, load_model_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize(
    "binding,expected",
    [
        ("MODEL_DIR=/tmp/run", "MODEL_DIR='/tmp/run'"),
        ("T5Config.emb_dim=64", "T5Config.emb_dim=64"),
        ("T5Config.dropout_rate=0.0", "T5Config.dropout_rate=0.0"),
        ("T5Config.logits_via_embedding=False", "T5Config.logits_via_embedding=False"),
        (
            "T5Config.mlp_activations=('gelu', 'linear')",
            "T5Config.mlp_activations=('gelu', 'linear')",
        ),
        ("x.y=@f()", "x.y=@f()"),
        ("x.y=%MACRO", "x.y=%MACRO"),
        ("T5Config.dtype=bfloat16", "T5Config.dtype='bfloat16'"),
        ("T5Config.dtype='float32'", "T5Config.dtype='float32'"),
    ],
)
def test_plain_strings_are_quoted(binding, expected):
    assert quote_plain_string(binding) == expected


def test_bindings_override_files():
    cfg = load_model_config(
        ["gin_configs/models/t5_1_1/small.gin"], ["T5Config.emb_dim=64", "T5Config.dtype=bfloat16"]
    )
    assert cfg.emb_dim == 64 and cfg.dtype == "bfloat16" and cfg.mlp_dim == 1024


def test_unknown_binding_is_an_error():
    with pytest.raises(ValueError, match="doesn't have a parameter named 'emb_dimm'"):
        load_model_config([], ["T5Config.emb_dimm=64"])


def test_bindings_edit_a_given_config():
    """Only the bound fields change, even a field bound to its class default (dropout 0.1 over
    a config with 0.0); the rest keep the given config's values, not the class defaults."""
    given = T5Config(
        emb_dim=256, num_heads=4, mlp_dim=1024, dropout_rate=0.0, mlp_activations=("gelu", "linear")
    )
    cfg = bind_over(given, ["T5Config.num_heads=2", "T5Config.dropout_rate=0.1"])
    assert (cfg.num_heads, cfg.dropout_rate) == (2, 0.1)
    assert (cfg.emb_dim, cfg.mlp_dim, cfg.mlp_activations) == (256, 1024, ("gelu", "linear"))
    assert bind_over(given, []) is given


def test_bindings_beyond_the_model_still_parse():
    """A binding of something other than a model config (here the tasks' C4 directory) makes
    the parse fall back to every configurable; the model config is the one bound."""
    cfg = load_model_config(
        ["gin_configs/models/t5_1_1/small.gin"],
        ["c4_files.json_dir='/tmp/c4'", "T5Config.emb_dim=64"],
    )
    assert (cfg.emb_dim, cfg.mlp_dim) == (64, 1024)


def test_reading_a_model_config_does_not_import_tensorflow():
    """A benchmark or the memory planner reads only the model config: TensorFlow (imported
    with the tasks' seqio) would add ~0.7 GB to the host memory the benchmarks measure."""
    script = textwrap.dedent("""
        import sys
        from t5x_like.gin_setup import bind_over, load_model_config
        from t5x_like.families.bert.network import BertConfig
        cfg = load_model_config(["gin_configs/models/t5_1_1/base.gin"], ["T5Config.emb_dim=64"])
        assert cfg.emb_dim == 64 and cfg.num_heads == 12, cfg
        assert bind_over(BertConfig(), ["BertConfig.num_layers=2"]).num_layers == 2
        print(sorted(m for m in ("tensorflow", "seqio", "t5x_like.tasks") if m in sys.modules))
    """)
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "[]"


def test_a_run_gin_file_loads_as_a_model_config():
    """A run's gin file binds train.*: reading the model config from model + run files (what
    the memory planner does with the files a run is launched with) parses them in full."""
    cfg = load_model_config(
        ["gin_configs/models/t5_1_1/small.gin", "gin_configs/runs/pretrain.gin"],
        ["T5Config.emb_dim=64"],
    )
    assert (cfg.emb_dim, cfg.mlp_dim) == (64, 1024)


@pytest.mark.parametrize(
    "entry,binding,refusal",
    [
        ("train", "Data.batch_size=8", "No model directory"),
        ("eval", "evaluate.batch_size=8", "No checkpoint"),
        ("infer", "infer.batch_size=8", "No checkpoint"),  # the task is optional with a file
    ],
)
def test_each_entry_point_run_as_a_module_has_one_configurable(entry, binding, refusal):
    """`python -m t5x_like.train` runs the file as `__main__`; the gin registry also imports
    `t5x_like.train` (so run gin files load anywhere). The binding must still name one
    configurable: the run gets past parsing to its first check (here: nothing to run on)."""
    run = subprocess.run(
        [sys.executable, "-m", f"t5x_like.{entry}", f"--gin.{binding}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert run.returncode == 2, run.stderr[-3000:]
    assert refusal in run.stderr and "bad gin configuration" not in run.stderr, run.stderr[-3000:]
