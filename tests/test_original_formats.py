"""`convert --from_original`: Google's TF1 BERT release and OpenAI's GPT-1 release, imported
and checked against transformers 4.57.6's own loaders of those formats
(`load_tf_weights_in_bert`, `load_tf_weights_in_openai_gpt`, run in an oracle process from
requirements/oracles_transformers4.txt): the same fixture, written in the original format from
random weights, goes through their loader into transformers' PyTorch model and through ours
into our checkpoint, and the logits agree to 1e-4 (float32). Every kind of refusal writes
nothing.

The fixtures name their variables and order their arrays from the releases' own code (BERT:
modeling.py and run_pretraining.py of google-research/bert; GPT-1: train.py of
openai/finetune-transformer-lm), not from our importers' tables. Weights are drawn larger than
the releases' N(0, 0.02) initialisation, so a wrong transpose, activation or layer norm shows
far above the tolerance.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from t5x_like import convert
from t5x_like.checkpoints import params_io, tokenizer_files
from tests.oracle import TRANSFORMERS4, run_oracle

pytest.importorskip("torch")

TOLERANCE = 1e-4

# ------------------------------------------------------------------------------ BERT
BERT_CONFIG = {
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 32,
    "initializer_range": 0.02,
    "intermediate_size": 64,
    "max_position_embeddings": 24,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "type_vocab_size": 2,
    "vocab_size": 40,
}


def _bert_vocab(cased: bool) -> list[str]:
    words = ["the", "a", "cat", "sat", "on", "mat", "##s", "##ed", "dog", "ran"]
    if cased:
        words += ["The", "Cat"]
    pieces = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    pieces += [f"x{i}" for i in range(BERT_CONFIG["vocab_size"] - len(pieces))]
    return pieces


def _bert_variables(config: dict, heads: bool, rng) -> dict[str, np.ndarray]:
    """Google's variable names and shapes (modeling.py: embedding_lookup,
    embedding_postprocessor, transformer_model, the pooler; run_pretraining.py:
    get_masked_lm_output, get_next_sentence_output)."""
    h, ff, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    shapes = {
        "bert/embeddings/word_embeddings": (v, h),
        "bert/embeddings/token_type_embeddings": (config["type_vocab_size"], h),
        "bert/embeddings/position_embeddings": (config["max_position_embeddings"], h),
        "bert/embeddings/LayerNorm/beta": (h,),
        "bert/embeddings/LayerNorm/gamma": (h,),
        "bert/pooler/dense/kernel": (h, h),
        "bert/pooler/dense/bias": (h,),
    }
    for i in range(config["num_hidden_layers"]):
        layer = f"bert/encoder/layer_{i}"
        for name in ("query", "key", "value"):
            shapes[f"{layer}/attention/self/{name}/kernel"] = (h, h)
            shapes[f"{layer}/attention/self/{name}/bias"] = (h,)
        shapes[f"{layer}/attention/output/dense/kernel"] = (h, h)
        shapes[f"{layer}/attention/output/dense/bias"] = (h,)
        shapes[f"{layer}/attention/output/LayerNorm/beta"] = (h,)
        shapes[f"{layer}/attention/output/LayerNorm/gamma"] = (h,)
        shapes[f"{layer}/intermediate/dense/kernel"] = (h, ff)
        shapes[f"{layer}/intermediate/dense/bias"] = (ff,)
        shapes[f"{layer}/output/dense/kernel"] = (ff, h)
        shapes[f"{layer}/output/dense/bias"] = (h,)
        shapes[f"{layer}/output/LayerNorm/beta"] = (h,)
        shapes[f"{layer}/output/LayerNorm/gamma"] = (h,)
    if heads:
        shapes.update(
            {
                "cls/predictions/transform/dense/kernel": (h, h),
                "cls/predictions/transform/dense/bias": (h,),
                "cls/predictions/transform/LayerNorm/beta": (h,),
                "cls/predictions/transform/LayerNorm/gamma": (h,),
                "cls/predictions/output_bias": (v,),
                "cls/seq_relationship/output_weights": (2, h),
                "cls/seq_relationship/output_bias": (2,),
            }
        )
    variables = {}
    for name, shape in shapes.items():
        value = rng.normal(0.0, 0.3, shape)
        if name.endswith("gamma"):
            value = 1.0 + value
        variables[name] = value.astype(np.float32)
    return variables


def _sentencepiece_model(path, sentinels: bool = False) -> None:
    """A small SentencePiece model learnt from Python's language reference; `sentinels` puts
    <extra_id_0..99> in it as pieces, as t5x's cc_all.32000.100extra model has them."""
    from pydoc_data.topics import topics

    import sentencepiece as spm

    extra = [f"<extra_id_{i}>" for i in range(100)] if sentinels else []
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([topics[k] for k in sorted(topics)[:30]]),
        model_prefix=str(path).removesuffix(".model"),
        vocab_size=250,
        user_defined_symbols=extra,
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
    )


def _save_tf_checkpoint(prefix: str, variables: dict[str, np.ndarray]) -> None:
    """A TF1 checkpoint (NAME.index + NAME.data-00000-of-00001) with exactly these names."""
    import tensorflow as tf

    names = sorted(variables)
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=names,
        shape_and_slices=[""] * len(names),
        tensors=[tf.constant(variables[n]) for n in names],
    )


def _bert_release(
    directory, heads=True, cased=False, config=None, extra=None, drop=(), seed=0
) -> None:
    """A directory laid out as `uncased_L-12_H-768_A-12.zip` unpacks, with random weights and
    (as a pretraining run's output has) Adam's slot variables and the step beside them."""
    config = config or BERT_CONFIG
    directory.mkdir(parents=True, exist_ok=True)
    variables = _bert_variables(BERT_CONFIG, heads, np.random.default_rng(seed))
    optimizer = {f"{n}/adam_m": np.zeros_like(v) for n, v in list(variables.items())[:3]}
    optimizer["global_step"] = np.array(1000, np.int64)
    variables = {**variables, **optimizer, **(extra or {})}
    for name in drop:
        del variables[name]
    _save_tf_checkpoint(str(directory / "bert_model.ckpt"), variables)
    (directory / "bert_config.json").write_text(json.dumps(config, indent=2))
    (directory / "vocab.txt").write_text("\n".join(_bert_vocab(cased)) + "\n")


def _bert_batch():
    rng = np.random.default_rng(7)
    ids = rng.integers(1, BERT_CONFIG["vocab_size"], (2, 11))
    ids[0, -3:] = 0
    segments = np.zeros_like(ids)
    segments[:, 5:] = 1
    return ids, segments, (ids != 0).astype(np.int64)


def _restored(checkpoint_dir):
    import jax

    directory = params_io.checkpoint_directory(str(checkpoint_dir))
    return params_io.restore_config(directory), jax.device_get(
        params_io.restore_saved_params(directory)
    )


def _convert_original(source, destination) -> int:
    return convert.main(["--from_original", str(source), "--to", str(destination)])


@pytest.mark.parametrize("heads", [True, False], ids=["pretraining_heads", "encoder_only"])
def test_google_bert_equals_transformers_tf_loader(tmp_path, heads):
    import jax.numpy as jnp

    from t5x_like.families.bert import network as bert

    _bert_release(tmp_path / "release", heads=heads)
    assert _convert_original(tmp_path / "release", tmp_path / "ours") == 0
    ids, segments, mask = _bert_batch()
    reference = run_oracle(
        "transformers_tf_loaders",
        {
            "format": "bert",
            "checkpoint": str(tmp_path / "release" / "bert_model.ckpt"),
            "config": str(tmp_path / "release" / "bert_config.json"),
            "ids": ids.tolist(),
            "segments": segments.tolist(),
            "mask": mask.tolist(),
        },
        packages=TRANSFORMERS4,
    )
    config, params = _restored(tmp_path / "ours")
    real = mask.astype(bool)
    args = (jnp.asarray(ids), jnp.asarray(segments), jnp.asarray(mask))
    sequence, pooled = bert.BertEncoder(config).apply({"params": params["encoder"]}, *args)
    np.testing.assert_allclose(
        np.asarray(sequence)[real], np.asarray(reference["sequence"])[real], atol=TOLERANCE
    )
    np.testing.assert_allclose(np.asarray(pooled), reference["pooled"], atol=TOLERANCE)
    if heads:
        out = bert.BertForPreTraining(config).apply({"params": params}, *args)
        np.testing.assert_allclose(
            np.asarray(out["mlm_logits"])[real],
            np.asarray(reference["mlm_logits"])[real],
            atol=TOLERANCE,
        )
        np.testing.assert_allclose(out["nsp_logits"], reference["nsp_logits"], atol=TOLERANCE)
    else:
        assert "mlm" not in params and "nsp" not in params


@pytest.mark.parametrize("cased", [False, True], ids=["uncased", "cased"])
def test_google_bert_vocab_travels_with_the_checkpoint(tmp_path, cased):
    """vocab.txt is kept beside the weights, described as a WordPiece vocabulary that lower-cases
    when the release is uncased; our WordPiece tokenizer reads it back with the release's ids."""
    from t5x_like.data.wordpiece import WordPieceVocabulary

    _bert_release(tmp_path / "release", cased=cased)
    assert _convert_original(tmp_path / "release", tmp_path / "ours") == 0
    described = tokenizer_files.description(str(tmp_path / "ours"))
    assert described is not None
    assert described["type"] == "wordpiece" and described["lower_case"] is (not cased)
    assert tokenizer_files.model_conventions(str(tmp_path / "ours")) is None  # not a GPT
    kept = tmp_path / "ours" / "tokenizer" / "vocab.txt"
    assert kept.read_text() == (tmp_path / "release" / "vocab.txt").read_text()
    vocabulary = WordPieceVocabulary(str(kept), lower_case=described["lower_case"])
    pieces = _bert_vocab(cased)
    text = "The cat sat" if cased else "the cat sat"
    assert vocabulary.encode(text) == [pieces.index(w) for w in text.split()]


def _refused(tmp_path, capsys, source=None) -> str:
    destination = tmp_path / "ours"
    assert _convert_original(source or tmp_path / "release", destination) == 2
    assert not destination.exists(), "a refused import wrote something"
    return capsys.readouterr().err


def test_google_bert_refusals(tmp_path, capsys):
    h = BERT_CONFIG["hidden_size"]
    # A variable BERT does not have (run_classifier.py's task head, say).
    _bert_release(
        tmp_path / "release",
        extra={"output_weights": np.zeros((3, h), np.float32), "output_bias": np.zeros(3)},
    )
    err = _refused(tmp_path, capsys)
    assert "output_bias, output_weights" in err and "does not have" in err

    # A shape the config does not imply.
    _bert_release(tmp_path / "wide", config={**BERT_CONFIG, "intermediate_size": 48})
    err = _refused(tmp_path, capsys, tmp_path / "wide")
    assert "intermediate.dense.weight gives shape" in err and "bert_config.json implies" in err

    # An activation this BERT does not compute.
    _bert_release(tmp_path / "relu", config={**BERT_CONFIG, "hidden_act": "relu"})
    assert "hidden_act='relu'" in _refused(tmp_path, capsys, tmp_path / "relu")

    # A variable the config implies but the checkpoint lacks.
    _bert_release(tmp_path / "short", drop=("bert/encoder/layer_1/output/dense/kernel",))
    err = _refused(tmp_path, capsys, tmp_path / "short")
    assert "lacks 1 variable(s)" in err and "bert/encoder/layer_1/output/dense/kernel" in err

    # Another model's vocabulary, and none at all.
    _bert_release(tmp_path / "vocab")
    (tmp_path / "vocab" / "vocab.txt").write_text("\n".join(_bert_vocab(False)[:30]) + "\n")
    err = _refused(tmp_path, capsys, tmp_path / "vocab")
    assert "has 30 pieces but bert_config.json says vocab_size=40" in err
    (tmp_path / "vocab" / "vocab.txt").unlink()
    assert "No vocab.txt" in _refused(tmp_path, capsys, tmp_path / "vocab")

    # A truncated data file.
    _bert_release(tmp_path / "cut")
    (data,) = (tmp_path / "cut").glob("bert_model.ckpt.data-*")
    data.write_bytes(data.read_bytes()[:100])
    assert "fetch it again" in _refused(tmp_path, capsys, tmp_path / "cut")


def test_a_directory_in_no_known_format_is_refused(tmp_path, capsys):
    (tmp_path / "stuff").mkdir()
    (tmp_path / "stuff" / "notes.txt").write_text("hello")
    err = _refused(tmp_path, capsys, tmp_path / "stuff")
    assert "Google BERT (TF1)" in err and "OpenAI GPT-1 release" in err and "--from_hf" in err


# ------------------------------------------------------------------------------ GPT-1
GPT = {"n_ctx": 16, "n_embd": 48, "n_layer": 2, "n_vocab": 50}  # 12 heads of 4


def _gpt_arrays(rng, n_embd=GPT["n_embd"]) -> tuple[list[np.ndarray], list[str]]:
    """The arrays of OpenAI's release in train.py's order (`we`'s two tables, then per block
    the variables `block` creates: attn's c_attn and c_proj, ln_1, mlp's c_fc and c_proj,
    ln_2), with the TF names transformers' loader reads from parameters_names.json."""
    d = n_embd
    arrays = [rng.normal(0, 0.3, (GPT["n_ctx"], d)), rng.normal(0, 0.3, (GPT["n_vocab"], d))]
    names = ["model/we:0"]
    for i in range(GPT["n_layer"]):
        block = [
            ("attn/c_attn/w", (1, d, 3 * d)),
            ("attn/c_attn/b", (3 * d,)),
            ("attn/c_proj/w", (1, d, d)),
            ("attn/c_proj/b", (d,)),
            ("ln_1/g", (d,)),
            ("ln_1/b", (d,)),
            ("mlp/c_fc/w", (1, d, 4 * d)),
            ("mlp/c_fc/b", (4 * d,)),
            ("mlp/c_proj/w", (1, 4 * d, d)),
            ("mlp/c_proj/b", (d,)),
            ("ln_2/g", (d,)),
            ("ln_2/b", (d,)),
        ]
        for name, shape in block:
            value = rng.normal(0, 0.3, shape)
            arrays.append(1.0 + value if name.endswith("/g") else value)
            names.append(f"model/h{i}/{name}:0")
    return [a.astype(np.float32) for a in arrays], names


def _gpt_release(directory, seed=0, n_embd=GPT["n_embd"], vocab_entries=None) -> None:
    """finetune-transformer-lm's model/ folder: the arrays concatenated and cut into ten
    .npy files, their shapes, and the BPE encoder and merges (plus parameters_names.json,
    which transformers' loader asks for beside them)."""
    directory.mkdir(parents=True, exist_ok=True)
    arrays, names = _gpt_arrays(np.random.default_rng(seed), n_embd)
    flat = np.concatenate([a.reshape(-1) for a in arrays])
    for n, piece in enumerate(np.array_split(flat, 10)):
        np.save(directory / f"params_{n}.npy", piece)
    (directory / "params_shapes.json").write_text(json.dumps([list(a.shape) for a in arrays]))
    (directory / "parameters_names.json").write_text(json.dumps(names))
    tokens = ["t</w>", "h", "e</w>", "th", "the</w>", "c", "a", "t", "cat</w>", "ca"]
    tokens += [f"w{i}</w>" for i in range(GPT["n_vocab"] - len(tokens))]
    tokens = tokens[: vocab_entries or GPT["n_vocab"]]
    (directory / "encoder_bpe_40000.json").write_text(
        json.dumps({t: i for i, t in enumerate(tokens)})
    )
    (directory / "vocab_40000.bpe").write_text("#version: 0.2\nt h\nth e</w>\nc a\nca t</w>\n")


def test_openai_gpt1_release_equals_transformers_loader(tmp_path):
    import jax.numpy as jnp

    from t5x_like.families.gpt.network import DecoderOnly

    _gpt_release(tmp_path / "model")
    assert _convert_original(tmp_path / "model", tmp_path / "ours") == 0
    ids = np.random.default_rng(3).integers(0, GPT["n_vocab"], (2, GPT["n_ctx"]))
    reference = run_oracle(
        "transformers_tf_loaders",
        {
            "format": "openai-gpt",
            "directory": str(tmp_path / "model"),
            "config": {
                "vocab_size": GPT["n_vocab"],
                "n_positions": GPT["n_ctx"],
                "n_embd": GPT["n_embd"],
                "n_layer": GPT["n_layer"],
                "n_head": 12,
                "afn": "gelu",
            },
            "ids": ids.tolist(),
        },
        packages=TRANSFORMERS4,
    )
    config, params = _restored(tmp_path / "ours")
    assert (config.num_heads, config.pre_layer_norm, config.activation) == (12, False, "gelu")
    logits = DecoderOnly(config).apply({"params": params}, jnp.asarray(ids))
    np.testing.assert_allclose(np.asarray(logits), reference["logits"], atol=TOLERANCE)
    described = tokenizer_files.description(str(tmp_path / "ours"))
    assert described is not None and described["type"] == "gpt1_bpe"
    for name in ("encoder_bpe_40000.json", "vocab_40000.bpe"):
        kept = tmp_path / "ours" / "tokenizer" / name
        assert kept.read_bytes() == (tmp_path / "model" / name).read_bytes()
    # GPT-1's BPE on the kept files, by hand: the+</w> merges t h, th e</w>; cat: c a, ca t</w>.
    vocabulary = tokenizer_files.vocabulary(str(tmp_path / "ours"))
    assert vocabulary is not None and vocabulary.encode("The cat") == [4, 8]
    # train.py's model: no start token, no EOS (its generation runs to length), causal.
    assert tokenizer_files.model_conventions(str(tmp_path / "ours")) == {
        "start_token_id": None,
        "eos_id": None,
        "attention": "causal",
    }


def test_openai_gpt1_refusals(tmp_path, capsys):
    _gpt_release(tmp_path / "model")
    (tmp_path / "model" / "params_7.npy").unlink()
    assert "lacks params_7.npy" in _refused(tmp_path, capsys, tmp_path / "model")

    _gpt_release(tmp_path / "cut")
    path = tmp_path / "cut" / "params_3.npy"
    path.write_bytes(path.read_bytes()[:-40])
    assert "fetch it again" in _refused(tmp_path, capsys, tmp_path / "cut")

    _gpt_release(tmp_path / "vocab", vocab_entries=30)
    err = _refused(tmp_path, capsys, tmp_path / "vocab")
    assert "has 30 tokens but the token embedding has 50 rows" in err

    _gpt_release(tmp_path / "shapes")
    shapes = json.loads((tmp_path / "shapes" / "params_shapes.json").read_text())
    (tmp_path / "shapes" / "params_shapes.json").write_text(json.dumps(shapes[:-1]))
    assert "lists 25 arrays" in _refused(tmp_path, capsys, tmp_path / "shapes")

    _gpt_release(tmp_path / "heads", n_embd=40)  # 40 is no multiple of GPT-1's 12 heads
    assert "multiple of its 12 heads" in _refused(tmp_path, capsys, tmp_path / "heads")


# ------------------------------------------------------------------------------ Mesh-TF T5
T5 = {"vocab": 48, "d_model": 16, "heads": 2, "d_kv": 8, "d_ff": 32, "layers": 2, "buckets": 8}
OPERATIVE = {
    "v1_0": "decoder/DenseReluDense.activation = 'relu'\n"
    "encoder/DenseReluDense.activation = 'relu'\n",
    "v1_1": "decoder/DenseReluDense.activation = ['gelu', 'linear']\n"
    "encoder/DenseReluDense.activation = ['gelu', 'linear']\n",
}


def _t5_variables(version: str, rng) -> dict[str, np.ndarray]:
    """The variable names of the released Mesh-TF T5 checkpoints (gs://t5-data/
    pretrained_models/*: shared/embedding, {encoder,decoder}/block_NNN/layer_NNN/...,
    the final norms, v1.1's separate decoder/logits), every matrix stored (in, out), with
    Adafactor's factored slots and the step beside them."""
    d, inner, ff, v = T5["d_model"], T5["heads"] * T5["d_kv"], T5["d_ff"], T5["vocab"]
    norm = "rms_norm" if version == "v1_1" else "layer_norm"  # both spellings are released
    shapes = {"shared/embedding": (v, d)}
    wis = ("wi_0", "wi_1") if version == "v1_1" else ("wi",)
    for stack in ("encoder", "decoder"):
        for i in range(T5["layers"]):
            attentions = ["SelfAttention"] + (["EncDecAttention"] if stack == "decoder" else [])
            for j, module in enumerate(attentions):
                layer = f"{stack}/block_{i:03d}/layer_{j:03d}"
                for name in ("q", "k", "v"):
                    shapes[f"{layer}/{module}/{name}"] = (d, inner)
                shapes[f"{layer}/{module}/o"] = (inner, d)
                shapes[f"{layer}/{norm}/scale"] = (d,)
                if i == 0 and module == "SelfAttention":
                    shapes[f"{layer}/{module}/relative_attention_bias"] = (
                        T5["heads"],
                        T5["buckets"],
                    )
            layer = f"{stack}/block_{i:03d}/layer_{len(attentions):03d}"
            for wi in wis:
                shapes[f"{layer}/DenseReluDense/{wi}/kernel"] = (d, ff)
            shapes[f"{layer}/DenseReluDense/wo/kernel"] = (ff, d)
            shapes[f"{layer}/{norm}/scale"] = (d,)
        shapes[f"{stack}/{'rms_norm' if version == 'v1_1' else 'final_layer_norm'}/scale"] = (d,)
    if version == "v1_1":
        shapes["decoder/logits/kernel"] = (d, v)
    variables = {}
    for name, shape in shapes.items():
        value = rng.normal(0, 0.5, shape)
        variables[name] = (1.0 + value if name.endswith("scale") else value).astype(np.float32)
    for name in list(variables)[:4]:
        variables[f"{name}_slot_vr"] = np.ones(variables[name].shape[:1], np.float32)
    variables["global_step"] = np.array(1_000_000, np.int64)
    return variables


def _t5_checkpoint(directory, version="v1_0", operative=None, extra=None, drop=(), spm=True):
    """A Mesh-TF model directory: `checkpoint`, model.ckpt-1000000.*, operative_config.gin."""
    directory.mkdir(parents=True, exist_ok=True)
    variables = {**_t5_variables(version, np.random.default_rng(1)), **(extra or {})}
    for name in drop:
        del variables[name]
    if version == "v1_1":  # Mesh-TF's default master dtype
        import ml_dtypes

        variables = {
            n: v.astype(ml_dtypes.bfloat16) if v.dtype == np.float32 else v
            for n, v in variables.items()
        }
    _save_tf_checkpoint(str(directory / "model.ckpt-1000000"), variables)
    (directory / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-1000000"\n')
    if operative is not False:
        (directory / "operative_config.gin").write_text(operative or OPERATIVE[version])
    if spm:
        _sentencepiece_model(directory / "sentencepiece.model")


def _t5_hf_config(version: str) -> dict:
    return {
        "vocab_size": T5["vocab"],
        "d_model": T5["d_model"],
        "d_kv": T5["d_kv"],
        "d_ff": T5["d_ff"],
        "num_layers": T5["layers"],
        "num_heads": T5["heads"],
        "relative_attention_num_buckets": T5["buckets"],
        "feed_forward_proj": "gated-gelu" if version == "v1_1" else "relu",
        "tie_word_embeddings": version == "v1_0",
    }


@pytest.mark.parametrize("version", ["v1_0", "v1_1"])
def test_mesh_tf_t5_equals_transformers_tf_loader(tmp_path, version):
    import jax.numpy as jnp

    from t5x_like.families.t5 import hf as t5_hf
    from t5x_like.families.t5.model import EncoderDecoderModel
    from t5x_like.families.t5.network import Transformer

    _t5_checkpoint(tmp_path / "model", version)
    assert _convert_original(tmp_path / "model", tmp_path / "ours") == 0
    batch = t5_hf.example_batch(T5["vocab"], seed=5)
    reference = run_oracle(
        "transformers_tf_loaders",
        {
            "format": "t5",
            "checkpoint": str(tmp_path / "model" / "model.ckpt-1000000"),
            "config": _t5_hf_config(version),
            "inputs": batch["encoder_input_tokens"].tolist(),
            "decoder_inputs": batch["decoder_input_tokens"].tolist(),
        },
        packages=TRANSFORMERS4,
    )
    config, params = _restored(tmp_path / "ours")
    assert config.logits_via_embedding == (version == "v1_0")
    model = EncoderDecoderModel(config)
    inputs = jnp.asarray(batch["encoder_input_tokens"])
    encoded = model.module.apply({"params": params}, inputs, method=Transformer.encode)
    real = batch["encoder_input_tokens"] > 0
    np.testing.assert_allclose(
        np.asarray(encoded)[real], np.asarray(reference["encoder"])[real], atol=TOLERANCE
    )
    logits = model.logits(params, {k: jnp.asarray(v) for k, v in batch.items()})
    np.testing.assert_allclose(np.asarray(logits), reference["logits"], atol=TOLERANCE)
    described = tokenizer_files.description(str(tmp_path / "ours"))
    assert described is not None and described["file"] == "sentencepiece.model"
    assert described["extra_ids"] == 100  # the original cc_all.32000 model has no sentinels


def test_mesh_tf_t5_without_operative_config_reads_the_layer_shape(tmp_path):
    _t5_checkpoint(tmp_path / "v11", "v1_1", operative=False, spm=False)
    assert _convert_original(tmp_path / "v11", tmp_path / "ours") == 0
    config, _ = _restored(tmp_path / "ours")
    assert config.mlp_activations == ("gelu", "linear") and not config.logits_via_embedding
    assert tokenizer_files.description(str(tmp_path / "ours")) is None


def test_mesh_tf_t5_refusals(tmp_path, capsys):
    _t5_checkpoint(tmp_path / "extra", extra={"encoder/block_000/adapter/kernel": np.zeros(3)})
    err = _refused(tmp_path, capsys, tmp_path / "extra")
    assert "encoder/block_000/adapter/kernel" in err and "does not have" in err

    _t5_checkpoint(tmp_path / "short", drop=("decoder/block_001/layer_001/EncDecAttention/k",))
    err = _refused(tmp_path, capsys, tmp_path / "short")
    assert "decoder.block.1.layer.1.EncDecAttention.k.weight" in err and "Missing" in err

    wide = {"encoder/block_001/layer_001/DenseReluDense/wo/kernel": np.zeros((40, 16), np.float32)}
    _t5_checkpoint(tmp_path / "wide", extra=wide)
    assert "DenseReluDense.wo.weight gives shape" in _refused(tmp_path, capsys, tmp_path / "wide")

    swish = "encoder/DenseReluDense.activation = 'swish'\n"
    _t5_checkpoint(tmp_path / "swish", operative=swish)
    assert "activation = ['swish']" in _refused(tmp_path, capsys, tmp_path / "swish")

    _t5_checkpoint(tmp_path / "mixed", "v1_1", operative=OPERATIVE["v1_0"])
    assert "another model's" in _refused(tmp_path, capsys, tmp_path / "mixed")


# ------------------------------------------------------------------------------ t5x
def _t5x_checkpoint(step_dir, params, extra=None, written_in_a_bucket=False):
    """A t5x step directory as t5x's checkpoints.py writes it: `checkpoint`, the msgpack of
    {'version': 3, 'optimizer': {'target': ..., 'state': ...}}, with each matrix replaced by
    the TensorStore spec of a gzip zarr array at `target.<dotted name>` (relative to the step
    directory) and each vector inline, DenseGeneral kernels flattened to 2-D.
    `written_in_a_bucket`: the specs as t5x's `_get_spec` writes them in gs:// (gcs driver, its
    dummy bucket, the path beside the kvstore), as a checkpoint copied to disk has them."""
    import jax
    import tensorstore as ts
    from flax import serialization

    step_dir.mkdir(parents=True)
    target: dict = {}
    flat = {
        "/".join(k.key for k in path): np.asarray(leaf, np.float32)
        for path, leaf in jax.tree_util.tree_leaves_with_path(params)
    }
    flat.update(extra or {})
    for name, value in flat.items():
        if name.endswith(("query/kernel", "key/kernel", "value/kernel")):
            value = value.reshape(value.shape[0], -1)
        elif name.endswith("out/kernel"):
            value = value.reshape(-1, value.shape[-1])
        if value.ndim >= 2:
            dotted = "target." + name.replace("/", ".")
            metadata = {"compressor": {"id": "gzip"}, "shape": list(value.shape)}
            metadata["chunks"] = [max(1, d // 2) for d in value.shape]
            spec = {"driver": "zarr", "dtype": "float32", "metadata": metadata}
            spec["kvstore"] = {"driver": "file", "path": dotted}
            if written_in_a_bucket:
                spec["kvstore"] = {"driver": "gcs", "bucket": "t5x-dummy-bucket"}
                spec["path"] = dotted
            written = {k: v for k, v in spec.items() if k != "path"}
            written["kvstore"] = {"driver": "file", "path": str(step_dir / dotted)}
            ts.open(written, create=True).result().write(value).result()
            leaf = spec
        else:
            leaf = value
        node = target
        *parents, last = name.split("/")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = leaf
    # Optimizer state that must be left unread: a spec of an array that was never written.
    never = {"driver": "zarr", "dtype": "float32", "metadata": {"shape": [4]}}
    never["kvstore"] = {"driver": "file", "path": "state.param_states.absent"}
    state = {"step": np.array(1000, np.int32), "param_states": {"absent": never}}
    contents = {"version": 3, "optimizer": {"target": target, "state": state}}
    (step_dir / "checkpoint").write_bytes(serialization.msgpack_serialize(contents))


def _hf_t5(version):
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.T5Config(
        vocab_size=T5["vocab"],
        d_model=T5["d_model"],
        d_kv=T5["d_kv"],
        d_ff=T5["d_ff"],
        num_layers=T5["layers"],
        num_heads=T5["heads"],
        relative_attention_num_buckets=T5["buckets"],
        feed_forward_proj="gated-gelu" if version == "v1_1" else "relu",
        tie_word_embeddings=version == "v1_0",
        **({"scale_decoder_outputs": False} if version == "v1_1" else {}),
    )
    model = transformers.T5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    return model


@pytest.mark.parametrize("version", ["v1_0", "v1_1"])
def test_t5x_checkpoint_equals_the_hf_path_and_transformers(tmp_path, version):
    """The same weights through both roads: HF -> ours (the tested HF import), then written
    as t5x writes them and read back by the t5x importer, give identical parameters, and the
    model on them gives transformers' logits."""
    import jax

    from t5x_like.families.t5 import hf as t5_hf

    model = _hf_t5(version)
    hf_cfg = t5_hf.config_from_hf(model.config.to_dict())
    via_hf = t5_hf.params_from_hf({k: v.numpy() for k, v in model.state_dict().items()}, hf_cfg)
    _t5x_checkpoint(tmp_path / "t5x" / "checkpoint_1000", via_hf)
    _sentencepiece_model(tmp_path / "t5x" / "checkpoint_1000" / "sentencepiece.model", True)
    assert _convert_original(tmp_path / "t5x", tmp_path / "ours") == 0
    config, params = _restored(tmp_path / "ours")
    assert config == hf_cfg
    flat_ours = jax.tree_util.tree_leaves_with_path(params)
    flat_hf = dict(jax.tree_util.tree_leaves_with_path(via_hf))
    assert len(flat_ours) == len(flat_hf)
    for path, value in flat_ours:
        np.testing.assert_array_equal(value, flat_hf[path], err_msg=str(path))
    diffs = t5_hf.max_abs_differences(model, config, params, t5_hf.example_batch(T5["vocab"]))
    assert max(diffs.values()) <= TOLERANCE, diffs
    described = tokenizer_files.description(str(tmp_path / "ours"))
    # The model holds its sentinels as pieces (t5x's 100extra vocabulary): none are added.
    assert described["type"] == "sentencepiece" and described["extra_ids"] == 0


def test_t5x_refusals(tmp_path, capsys):
    from t5x_like.families.t5 import hf as t5_hf

    model = _hf_t5("v1_1")
    cfg = t5_hf.config_from_hf(model.config.to_dict())
    params = t5_hf.params_from_hf({k: v.numpy() for k, v in model.state_dict().items()}, cfg)

    extra = {"encoder/adapter/kernel": np.zeros((16, 4), np.float32)}
    _t5x_checkpoint(tmp_path / "extra" / "checkpoint_1", params, extra=extra)
    assert "target/encoder/adapter/kernel" in _refused(tmp_path, capsys, tmp_path / "extra")

    wide = {"decoder/layers_1/mlp/wo/kernel": np.zeros((40, 16), np.float32)}
    _t5x_checkpoint(tmp_path / "wide" / "checkpoint_1", params, extra=wide)
    err = _refused(tmp_path, capsys, tmp_path / "wide")
    assert "target/decoder/layers_1/mlp/wo/kernel has shape [40, 16]" in err

    _t5x_checkpoint(tmp_path / "gone" / "checkpoint_1", params)
    import shutil

    shutil.rmtree(tmp_path / "gone" / "checkpoint_1" / "target.encoder.layers_0.mlp.wo.kernel")
    err = _refused(tmp_path, capsys, tmp_path / "gone")
    assert "encoder/layers_0/mlp/wo/kernel cannot be read from TensorStore" in err

    _t5x_checkpoint(tmp_path / "cut" / "checkpoint_1", params)
    path = tmp_path / "cut" / "checkpoint_1" / "checkpoint"
    path.write_bytes(path.read_bytes()[:-30])
    assert "not a readable t5x checkpoint" in _refused(tmp_path, capsys, tmp_path / "cut")

    # t5x's version-2 checkpoints: bfloat16 saved as uint16 bit patterns (t5x refuses them).
    _t5x_checkpoint(tmp_path / "u16" / "checkpoint_1", params)
    import tensorstore as ts
    from flax import serialization

    step = tmp_path / "u16" / "checkpoint_1"
    contents = serialization.msgpack_restore((step / "checkpoint").read_bytes())
    spec = contents["optimizer"]["target"]["token_embedder"]["embedding"]
    spec["dtype"] = "uint16"
    written = {**spec, "kvstore": {"driver": "file", "path": str(step / "u16.embedding")}}
    ts.open(written, create=True).result().write(np.zeros(spec["metadata"]["shape"], np.uint16))
    spec["kvstore"]["path"] = "u16.embedding"
    (step / "checkpoint").write_bytes(serialization.msgpack_serialize(contents))
    assert "stored as uint16" in _refused(tmp_path, capsys, tmp_path / "u16")

    (tmp_path / "orbax" / "checkpoint_5" / "state").mkdir(parents=True)
    assert "not a checkpoint in a format" in _refused(tmp_path, capsys, tmp_path / "orbax")


def test_t5x_specs_in_a_bucket_read_through_tensorstores_gcs_driver():
    """A step directory in a bucket: the relative spec becomes gcs driver + bucket + path, as
    t5x's `_update_ts_path_from_relative_to_absolute` makes it (worked by hand)."""
    from t5x_like.families.t5 import t5x_native

    spec = {
        "driver": "zarr",
        "dtype": "float32",
        "kvstore": {"driver": "gcs", "bucket": "t5x-dummy-bucket"},
        "path": "target.encoder.encoder_norm.scale",
        "metadata": {"shape": [768], "chunks": [768], "compressor": {"id": "gzip"}},
    }
    absolute = t5x_native._absolute_spec(
        spec, "gs://t5-data/pretrained_models/t5x/t5_1_1_base/checkpoint_1000000"
    )
    assert absolute["kvstore"] == {"driver": "gcs", "bucket": "t5-data"}
    assert absolute["path"] == (
        "pretrained_models/t5x/t5_1_1_base/checkpoint_1000000/target.encoder.encoder_norm.scale"
    )
    assert absolute["metadata"] == {"shape": [768]}
    assert spec["metadata"]["chunks"] == [768]  # the msgpack's own spec is left as it was


def test_original_formats_read_from_a_bucket(tmp_path):
    """The importers read through the storage layer (`ram://` standing in for gs://): a GPT-1
    release, a Google BERT release and a Mesh-TF T5 checkpoint copied to the bucket import to
    the same parameters as from disk."""
    import uuid

    import jax

    from t5x_like import storage

    bucket = f"ram://t5x_like_test/{uuid.uuid4().hex}"
    _gpt_release(tmp_path / "gpt")
    _bert_release(tmp_path / "bert")
    _t5_checkpoint(tmp_path / "mesh")
    for name in ("gpt", "bert", "mesh"):
        storage.copy_tree(str(tmp_path / name), f"{bucket}/{name}")
        assert _convert_original(tmp_path / name, tmp_path / f"{name}_disk") == 0
        assert _convert_original(f"{bucket}/{name}", tmp_path / f"{name}_bucket") == 0
        _, disk = _restored(tmp_path / f"{name}_disk")
        _, remote = _restored(tmp_path / f"{name}_bucket")
        for a, b in zip(jax.tree_util.tree_leaves(disk), jax.tree_util.tree_leaves(remote)):
            np.testing.assert_array_equal(a, b)
        assert (tmp_path / f"{name}_bucket" / "tokenizer" / "vocabulary.json").exists()


def test_a_t5x_checkpoint_copied_from_a_bucket_reads_from_disk(tmp_path):
    """Specs written in gs:// (gcs driver, dummy bucket) are read with the file driver from a
    local copy, as t5x's _maybe_update_ts_from_gcs_to_file does."""
    import jax

    from t5x_like.families.t5 import hf as t5_hf

    model = _hf_t5("v1_0")
    cfg = t5_hf.config_from_hf(model.config.to_dict())
    params = t5_hf.params_from_hf({k: v.numpy() for k, v in model.state_dict().items()}, cfg)
    _t5x_checkpoint(tmp_path / "copy" / "checkpoint_7", params, written_in_a_bucket=True)
    assert _convert_original(tmp_path / "copy", tmp_path / "ours") == 0
    _, restored = _restored(tmp_path / "ours")
    for a, b in zip(jax.tree_util.tree_leaves(restored), jax.tree_util.tree_leaves(params)):
        np.testing.assert_array_equal(a, b)
