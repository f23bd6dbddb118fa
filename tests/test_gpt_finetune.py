"""GPT-1 fine-tuning: the input transformations frame exactly as the paper's Figure 1, the
similarity head cannot tell the two orderings apart, the multiple-choice loss is a softmax over
the candidates (checked on hand-set scores), the auxiliary LM loss enters with weight lambda,
a pretrained LM checkpoint grafts onto the fine-tuning model with three new embedding rows,
and the trainer refuses a head that does not fit the task."""

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio
import tensorflow as tf

from t5x_like.errors import ConfigError
from t5x_like.families.gpt import preprocessors as gp
from t5x_like.families.gpt.finetune import GPTClassifierModel, language_model_loss
from t5x_like.families.gpt.model import DecoderOnlyModel
from t5x_like.families.gpt.network import GPTConfig
from t5x_like.models import base
from tests.word_vocab import WordVocabulary

VOCAB = WordVocabulary("the cat sat on mat dog ran far".split())
CONFIG = GPTConfig(
    vocab_size=32,
    max_position_embeddings=16,
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    intermediate_size=64,
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
    num_special_tokens=3,
)
START, DELIM, EXTRACT = 32, 33, 34


def _framed(kind, example, text_keys, length=12):
    gin.bind_parameter("GPTConfig.vocab_size", 32)
    ds = tf.data.Dataset.from_tensors(example)
    out = gp.transform(kind, text_keys)(
        ds, {"inputs": length}, {"inputs": seqio.Feature(VOCAB, add_eos=False)}
    )
    return next(iter(out.as_numpy_iterator()))


def _ids(text):
    return [VOCAB.encode(w)[0] for w in text.split()]


def test_input_transformations_frame_as_figure_1():
    pair = {"a": "the cat sat", "b": "dog ran", "label": 1}
    single = _framed("classification", pair, ("a",))
    assert single["inputs"].tolist() == [START, *_ids("the cat sat"), EXTRACT]
    entail = _framed("entailment", pair, ("a", "b"))
    assert entail["inputs"].tolist() == [
        START,
        *_ids("the cat sat"),
        DELIM,
        *_ids("dog ran"),
        EXTRACT,
    ]
    similar = _framed("similarity", pair, ("a", "b"), length=9)
    assert similar["inputs"].tolist() == [
        [START, *_ids("the cat sat"), DELIM, *_ids("dog ran"), EXTRACT, 0],
        [START, *_ids("dog ran"), DELIM, *_ids("the cat sat"), EXTRACT, 0],
    ]
    choices = _framed(
        "choices",
        {"c": "the cat", "options": ["sat", "ran far"], "label": 1},
        ("c", "options"),
        length=7,
    )
    assert choices["inputs"].tolist() == [
        [START, *_ids("the cat"), DELIM, *_ids("sat"), EXTRACT, 0],
        [START, *_ids("the cat"), DELIM, *_ids("ran far"), EXTRACT],
    ]
    assert choices["label"] == 1.0
    # Too long: the longer text loses its last tokens first; the extract token stays last.
    # (Length 7 less the 3 special tokens leaves 4: "dog" keeps its 1, A is cut from 6 to 3.)
    cut = _framed(
        "entailment", {"a": "the cat sat on the mat", "b": "dog", "label": 0}, ("a", "b"), length=7
    )
    assert cut["inputs"].tolist() == [START, *_ids("the cat sat"), DELIM, *_ids("dog"), EXTRACT]


def _without_special_tokens(config: GPTConfig) -> GPTConfig:
    import dataclasses

    return dataclasses.replace(config, num_special_tokens=0)


def _batch(ids, label):
    ids = np.asarray(ids, np.int32)
    return {
        "input_ids": jnp.asarray(ids),
        "input_mask": jnp.asarray(ids > 0, jnp.int32),
        "label": jnp.asarray(label, jnp.float32),
        "label_weights": jnp.ones(len(label), jnp.float32),
    }


def test_similarity_head_is_invariant_to_the_order_of_the_sentences():
    model = GPTClassifierModel(CONFIG, num_labels=2, combine="sum_orderings")
    params = model.init(jax.random.key(0))
    a, b = [START, 5, 6, 7, DELIM, 8, 9, EXTRACT], [START, 8, 9, DELIM, 5, 6, 7, EXTRACT]
    logits, _ = model.apply(params, _batch([[a, b]], [1]))
    swapped, _ = model.apply(params, _batch([[b, a]], [1]))
    np.testing.assert_allclose(logits, swapped, rtol=1e-6, atol=1e-6)
    # ...while a single ordering's head does see the order.
    single = GPTClassifierModel(CONFIG, num_labels=2)
    single_params = single.init(jax.random.key(0))
    one, _ = single.apply(single_params, _batch([a], [1]))
    other, _ = single.apply(single_params, _batch([b], [1]))
    assert not np.allclose(one, other)


def test_multiple_choice_loss_is_a_softmax_over_hand_set_scores(monkeypatch):
    model = GPTClassifierModel(CONFIG, combine="choices", num_choices=3, lm_coef=0.0)
    scores = jnp.array([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0]])
    uniform_lm = jnp.zeros((2, 3, 4, CONFIG.embedding_rows))
    monkeypatch.setattr(model, "apply", lambda params, batch, rng=None: (scores, uniform_lm))
    batch = _batch(np.ones((2, 3, 4)), [0, 1])
    sums = model.loss_sums(None, batch)
    # -log softmax: example 1 picks choice 0, example 2 choice 1.
    expected = [np.log(np.exp(2) + 1 + np.exp(-1)) - 2, np.log(2 * np.exp(0.5) + np.exp(3)) - 0.5]
    np.testing.assert_allclose(sums["loss_sum"], sum(expected), rtol=1e-6)
    np.testing.assert_allclose(
        base.objective(sums, model.loss_denominators(batch)), np.mean(expected), rtol=1e-6
    )
    assert float(sums["correct"]) == 1.0  # the first example's top score is its label


def test_auxiliary_language_model_loss_enters_with_weight_lambda():
    ids = [[START, 5, 6, 7, DELIM, 8, EXTRACT, 0], [START, 9, 10, EXTRACT, 0, 0, 0, 0]]
    batch = _batch(ids, [1, 0])
    with_lm = GPTClassifierModel(CONFIG, num_labels=2, lm_coef=0.5)
    without = GPTClassifierModel(CONFIG, num_labels=2, lm_coef=0.0)
    params = with_lm.init(jax.random.key(1))
    total = base.objective(with_lm.loss_sums(params, batch), with_lm.loss_denominators(batch))
    task = base.objective(without.loss_sums(params, batch), without.loss_denominators(batch))
    # L1 by hand: each sequence's mean next-token cross-entropy over its real tokens.
    _, lm_logits = with_lm.apply(params, batch)
    log_probs = np.asarray(jax.nn.log_softmax(lm_logits, -1))
    per_sequence = []
    for row, seq in enumerate(ids):
        n = sum(t > 0 for t in seq)
        per_sequence.append(-np.mean([log_probs[row, i, seq[i + 1]] for i in range(n - 1)]))
    np.testing.assert_allclose(total - task, 0.5 * np.mean(per_sequence), rtol=1e-5)
    np.testing.assert_allclose(
        language_model_loss(lm_logits, batch["input_ids"], batch["input_mask"]),
        per_sequence,
        rtol=1e-5,
    )


def test_pretrained_lm_grafts_with_three_new_embedding_rows(tmp_path, capsys):
    from t5x_like.checkpoints import params_io
    from t5x_like.families.t5 import network as t5

    pretrained_cfg = _without_special_tokens(CONFIG)
    lm = DecoderOnlyModel(pretrained_cfg)
    lm_params = t5.nn.meta.unbox(lm.init(jax.random.key(2)))
    params_io.save_params(str(tmp_path / "lm"), lm_params, pretrained_cfg)
    model = GPTClassifierModel(CONFIG, num_labels=3)
    fresh = t5.nn.meta.unbox(model.init(jax.random.key(3)))
    device = jax.sharding.NamedSharding(
        jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",)), jax.sharding.PartitionSpec()
    )
    abstract = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), fresh
    )
    loaded = params_io.load_pretrained(
        str(tmp_path / "lm"), CONFIG, abstract, fresh_params=lambda: fresh
    )
    table = np.asarray(loaded["token_embeddings"]["embedding"])
    np.testing.assert_array_equal(table[:32], lm_params["token_embeddings"]["embedding"])
    np.testing.assert_array_equal(table[32:], fresh["token_embeddings"]["embedding"][32:])
    np.testing.assert_array_equal(
        loaded["layers_1"]["mlp"]["wo"]["kernel"], lm_params["layers_1"]["mlp"]["wo"]["kernel"]
    )
    np.testing.assert_array_equal(loaded["classifier"]["kernel"], fresh["classifier"]["kernel"])
    assert "extended from 32 to 35 rows" in capsys.readouterr().out


def test_trainer_refuses_a_head_that_does_not_fit_the_task():
    from t5x_like import input_pipeline

    task = input_pipeline.resolve_task("gpt_glue_mrpc")
    with pytest.raises(ConfigError, match="combine = 'sum_orderings'"):
        input_pipeline.check_num_labels(task, GPTClassifierModel(CONFIG, num_labels=2))
    no_specials = _without_special_tokens(CONFIG)
    with pytest.raises(ConfigError, match="num_special_tokens = 3"):
        input_pipeline.check_num_labels(
            task, GPTClassifierModel(no_specials, num_labels=2, combine="sum_orderings")
        )
    with pytest.raises(ConfigError, match="num_labels = 1"):
        input_pipeline.check_num_labels(
            input_pipeline.resolve_task("gpt_glue_stsb"),
            GPTClassifierModel(CONFIG, combine="sum_orderings"),
        )


RACE_EXAMPLE = {
    "article": "the cat sat on the mat",
    "questions": ["who sat", "where"],
    "answers": ["B", "D"],
    "options": [["dog", "cat", "mat", "far"], ["on", "the", "far", "mat"]],
    "example_id": "high1.txt",
}
GLUE_MRPC = {"sentence1": "the cat sat", "sentence2": "a dog ran", "label": 1, "idx": 0}


@pytest.fixture(scope="module")
def tiny_benchmarks(tmp_path_factory):
    """gpt_glue_mrpc and gpt_race_high on tiny real TFDS builds, read with the word-level test
    vocabulary (the C4 SentencePiece model cannot be downloaded here)."""
    from t5x_like import tasks  # noqa: F401
    from tests.tiny_tfds import build_tiny

    path = str(tmp_path_factory.mktemp("tfds"))
    build_tiny("glue/mrpc", {"train": [GLUE_MRPC] * 2, "validation": [GLUE_MRPC]}, path)
    build_tiny(
        "race/high", {"train": [RACE_EXAMPLE], "dev": [RACE_EXAMPLE], "test": [RACE_EXAMPLE]}, path
    )
    names = {}
    for name, rank in (("gpt_glue_mrpc", 2), ("gpt_race_high", 2)):
        task = seqio.get_mixture_or_task(name)
        task.source.tfds_dataset.override_data_dir(path)
        variant = task.replace(
            name=f"{name}_words",
            output_features={"inputs": seqio.Feature(VOCAB, add_eos=False, rank=rank)},
        )
        seqio.TaskRegistry.remove(variant.name)
        seqio.TaskRegistry.add_provider(variant.name, variant)
        names[name] = variant.name
    return names


def _examples(task_name, length):
    gin.bind_parameter("GPTConfig.vocab_size", 32)
    ds = seqio.get_mixture_or_task(task_name).get_dataset(
        {"inputs": length}, split="train", shuffle=False
    )
    return list(ds.as_numpy_iterator())


def test_glue_similarity_task_frames_both_orderings(tiny_benchmarks):
    [example] = _examples(tiny_benchmarks["gpt_glue_mrpc"], 9)[:1]
    assert example["inputs"].tolist() == [
        [START, *_ids("the cat sat"), DELIM, *_ids("a dog ran"), EXTRACT][:9],
        [START, *_ids("a dog ran"), DELIM, *_ids("the cat sat"), EXTRACT][:9],
    ]
    assert example["label"] == 1.0


def test_race_gives_one_example_per_question_with_its_options(tiny_benchmarks):
    examples = _examples(tiny_benchmarks["gpt_race_high"], 12)
    assert [ex["label"] for ex in examples] == [1.0, 3.0]  # answers B and D
    first = examples[0]["inputs"]
    assert first.shape == (4, 12)
    context = _ids("the cat sat on the mat who sat")
    for row, option in zip(first, ["dog", "cat", "mat", "far"]):
        assert row.tolist() == [START, *context, DELIM, *_ids(option), EXTRACT]  # exactly 12
