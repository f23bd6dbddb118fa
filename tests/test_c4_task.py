"""The registered C4 task on a tiny real TFDS c4/en built on disk, and its missing-data error."""

import numpy as np
import pytest
import seqio

from t5x_like import (
    input_pipeline,
    tasks,  # noqa: F401  (registers the tasks)
)
from t5x_like.errors import ConfigError
from tests.tiny_tfds import build_tiny_c4, with_offline_vocabulary


@pytest.fixture()
def tfds_dir(tmp_path):
    """A fresh TFDS data_dir for the C4 source (its loader keeps the first override it sees,
    so the test points the loader itself at the new directory)."""
    loader = seqio.get_mixture_or_task("c4_v220_span_corruption").source.tfds_dataset
    loader.override_data_dir(str(tmp_path))
    yield tmp_path


@pytest.mark.parametrize("version", ["3.1.0", "3.0.1"])
def test_c4_task_yields_packed_batches(tfds_dir, version):
    build_tiny_c4(str(tfds_dir), version)
    task = seqio.get_mixture_or_task("c4_v220_span_corruption")
    input_pipeline.check_data_available(task, "train")  # no error: the data is there
    name = f"c4_test_{version.replace('.', '_')}"
    with_offline_vocabulary("c4_v220_span_corruption", name)
    ds = seqio.get_dataset(
        name,
        {"inputs": 512, "targets": 114},
        seqio.EncDecFeatureConverter(pack=True),
        dataset_split="train",
        shuffle=False,
        seed=0,
        batch_size=2,
    )
    batch = next(ds.as_numpy_iterator())
    assert batch["encoder_input_tokens"].shape == (2, 512)
    assert batch["decoder_target_tokens"].shape == (2, 114)
    for key in (
        "encoder_segment_ids",
        "decoder_segment_ids",
        "decoder_input_tokens",
        "decoder_loss_weights",
        "encoder_positions",
    ):
        assert key in batch
    # Packing: the first row holds a full 512-token example (a 568-token chunk of the
    # concatenated documents), ending in EOS.
    row = batch["encoder_input_tokens"][0]
    assert np.sum(batch["encoder_segment_ids"][0] == 1) == 512 and row[-1] == 1
    vocab = seqio.get_mixture_or_task(name).output_features["targets"].vocabulary
    sentinels = row[row >= vocab.vocab_size - 100]
    assert sentinels.tolist() == list(
        range(vocab.vocab_size - 1, vocab.vocab_size - 1 - len(sentinels), -1)
    )
    assert "river" in vocab.decode(row.tolist())


def test_missing_tfds_data_is_explained(tfds_dir):
    task = seqio.get_mixture_or_task("c4_v220_span_corruption")
    with pytest.raises(ConfigError, match=r"not prepared.*tfds build c4.*offline_span_corruption"):
        input_pipeline.check_data_available(task, "train")


def test_unknown_task_suggests_names():
    with pytest.raises(ConfigError, match="Did you mean 'c4_v220_span_corruption'"):
        input_pipeline.resolve_task("c4_v220_span_corruptoin")
