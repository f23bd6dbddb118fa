"""Tiny but real TFDS datasets written to a temporary data_dir.

The builder has the registered dataset's name, config, version and features, but generates a
few examples itself, so `download_and_prepare()` writes the same files a real build would and
the registered builder then reads them (no network, no Apache Beam).
"""

from __future__ import annotations

import tensorflow_datasets as tfds

C4_FEATURES = ("text", "url", "content-type", "content-length", "timestamp")


def build_tiny_c4(
    data_dir: str, version: str = "3.1.0", num_train: int = 24, num_validation: int = 6
) -> str:
    """Prepare c4/en:<version> with a few English documents; returns the dataset directory."""

    class TinyC4(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        name = "c4"
        VERSION = tfds.core.Version(version)
        BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="en")]

        def _info(self):
            features = {k: tfds.features.Text() for k in C4_FEATURES}
            return tfds.core.DatasetInfo(
                builder=self, features=tfds.features.FeaturesDict(features)
            )

        def _split_generators(self, dl_manager):
            del dl_manager
            return {
                "train": self._generate_examples(0, num_train),
                "validation": self._generate_examples(1000, num_validation),
            }

        def _generate_examples(self, start, count):
            for i in range(start, start + count):
                text = " ".join(
                    f"Page {i} sentence {j} tells how the river carried boats to the old "
                    f"harbour where {j + i} traders met every morning."
                    for j in range(12 + i % 7)
                )
                yield (
                    i,
                    {
                        "text": text,
                        "url": f"http://example.com/{i}",
                        "content-type": "text/plain",
                        "content-length": str(len(text)),
                        "timestamp": "2019-04-25T00:00:00Z",
                    },
                )

    builder = TinyC4(data_dir=data_dir)
    builder.download_and_prepare()
    return builder.data_dir


def build_tiny(
    name: str, examples: dict[str, list[dict]], data_dir: str, version: str | None = None
) -> str:
    """Prepare the registered TFDS dataset `name` ('glue/cola', 'squad/v1.1', ...) in
    `data_dir` from the given examples per split: the real builder class (its features,
    config and version, or `version` if given) with only its download step replaced."""
    builder_name, _, config = name.partition("/")
    base = tfds.builder_cls(builder_name)
    attributes = {
        "name": base.name,  # not derived from the subclass' name
        "__module__": base.__module__,  # builders find their metadata files beside it
        "_split_generators": lambda self, dl_manager: {
            split: ((i, ex) for i, ex in enumerate(rows)) for split, rows in examples.items()
        },
    }
    if version is not None:
        attributes["VERSION"] = tfds.core.Version(version)
        attributes["SUPPORTED_VERSIONS"] = []
        attributes["RELEASE_NOTES"] = {version: "tiny test build"}
    tiny = type(f"Tiny{base.__name__}", (base,), attributes, skip_registration=True)
    builder = tiny(config=config or None, data_dir=data_dir)
    builder.download_and_prepare()
    return builder.data_dir


def with_offline_vocabulary(task_name: str, new_name: str):
    """The registered task with the offline vocabulary (T5's 32k model is not downloadable)."""
    import seqio

    from t5x_like.tasks import offline, pretraining

    variant = seqio.get_mixture_or_task(task_name).replace(
        name=new_name, output_features=pretraining.output_features(offline.OfflineVocabulary())
    )
    seqio.TaskRegistry.remove(new_name)
    seqio.TaskRegistry.add_provider(new_name, variant)
    return variant
