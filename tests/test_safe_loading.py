"""Safe loading: HuggingFace imports read safetensors, or `.bin` files through torch's
weights-only unpickler; a pickle that would run code is refused before it can, for every
family's importer."""

from __future__ import annotations

import os
import pickle

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from t5x_like.families.bert import hf as hf_bert  # noqa: E402
from t5x_like.families.gpt import hf as hf_gpt  # noqa: E402
from t5x_like.families.t5 import hf as hf_t5  # noqa: E402
from tests.test_hf_parity import _make_hf_checkpoint  # noqa: E402


class _RunsCode:
    """Unpickling this calls os.system: what a malicious pytorch_model.bin does."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _plant_bin(directory, payload) -> None:
    for name in os.listdir(directory):
        if name.startswith("model.safetensors"):
            os.remove(os.path.join(directory, name))
    with open(os.path.join(directory, "pytorch_model.bin"), "wb") as f:
        pickle.dump(payload, f)


@pytest.mark.parametrize("family", ["t5", "gpt", "bert"])
def test_a_pickle_that_runs_code_is_refused_and_never_runs(family, tmp_path):
    directory = tmp_path / "hf"
    if family == "t5":
        _make_hf_checkpoint(directory, "v1_1_gated_gelu_untied")
        load = hf_t5.load_hf_checkpoint
    elif family == "gpt":
        transformers.GPT2LMHeadModel(
            transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2)
        ).save_pretrained(directory)
        load = hf_gpt.load_hf_checkpoint
    else:
        transformers.BertForPreTraining(
            transformers.BertConfig(
                vocab_size=64,
                hidden_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=32,
                max_position_embeddings=16,
            )
        ).save_pretrained(directory)
        load = hf_bert.load_hf_checkpoint
    marker = tmp_path / "code_ran"
    _plant_bin(directory, {"shared.weight": _RunsCode(str(marker))})
    with pytest.raises(
        hf_t5.CheckpointError,
        match=r"pytorch_model.bin was not loaded: it holds "
        r"more than tensors.*could run code",
    ):
        load(str(directory))
    assert not marker.exists(), "unpickling ran the file's code"


def test_a_plain_weights_bin_loads_like_its_safetensors(tmp_path):
    model = _make_hf_checkpoint(tmp_path / "safe", "v1_1_gated_gelu_untied")
    cfg, expected = hf_t5.load_hf_checkpoint(str(tmp_path / "safe"))
    # What older transformers wrote: config.json beside a torch.save'd state dict.
    os.makedirs(tmp_path / "bin")
    model.config.to_json_file(str(tmp_path / "bin" / "config.json"))
    torch.save(model.state_dict(), str(tmp_path / "bin" / "pytorch_model.bin"))
    cfg_bin, got = hf_t5.load_hf_checkpoint(str(tmp_path / "bin"))
    assert cfg_bin == cfg
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(expected)
    for a, b in zip(jax.tree_util.tree_leaves(expected), jax.tree_util.tree_leaves(got)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
