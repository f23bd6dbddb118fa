"""Oracle: the T5 library's (t5 0.9.4) pretraining examples for a C4 source and a seed.

Either a task the library registers (`c4_v220_span_corruption`, `c4_v220_prefix_lm`,
`c4_v220_iid_denoising`, `c4_v220_full_lm`) or the pipeline one of its objective gin files
(t5/models/gin/objectives/*.gin) configures for `preprocessors.unsupervised`, on TFDS
c4/en:2.2.0 in the payload's data_dir, with the payload's SentencePiece model in place of the
default (remote) vocabulary.
"""

import dataclasses
import functools
import os

from tests.oracle import oracle_main


def compute(payload):
    import gin
    import seqio
    import t5.data

    vocabulary = seqio.SentencePieceVocabulary(payload["spm_path"], extra_ids=100)
    t5.data.get_default_vocabulary = lambda: vocabulary  # before the tasks are registered
    import t5.data.preprocessors as t5_preprocessors
    import t5.data.tasks as t5_tasks

    seqio.set_tfds_data_dir_override(payload["data_dir"])
    gin_dir = os.path.join(os.path.dirname(t5.__file__), "models", "gin")
    results = {}
    for case in payload["cases"]:
        gin.clear_config()
        if "task" in case:
            task = seqio.get_mixture_or_task(case["task"])
            # `c4_v220_full_lm` reads its own (remote) vocabulary file: use the payload's.
            task = task.replace(
                output_features={
                    k: dataclasses.replace(f, vocabulary=vocabulary)
                    for k, f in task.output_features.items()
                }
            )
        else:
            gin.add_config_file_search_path(gin_dir)
            # span.gin fixes its inputs length as a macro (512); bind the case's.
            inputs_length = case["sequence_length"].get("inputs")
            bindings = [f"inputs_length = {inputs_length}"] if inputs_length else []
            gin.parse_config_files_and_bindings(
                [f"objectives/{case['gin']}"], bindings, skip_unknown=True
            )
            task = seqio.Task(
                "oracle_" + case["name"].replace("@", "_seed"),
                source=seqio.TfdsDataSource(tfds_name="c4/en:2.2.0"),
                preprocessors=[
                    functools.partial(
                        seqio.preprocessors.rekey, key_map={"inputs": None, "targets": "text"}
                    ),
                    seqio.preprocessors.tokenize,
                    seqio.CacheDatasetPlaceholder(),
                    t5_preprocessors.unsupervised,
                    seqio.preprocessors.append_eos_after_trim,
                ],
                output_features=t5_tasks.DEFAULT_OUTPUT_FEATURES,
                metric_fns=[],
            )
        ds = task.get_dataset(
            case["sequence_length"],
            split="train",
            shuffle=False,
            seed=case["seed"],
            use_cached=False,
        )
        results[case["name"]] = [
            {k: ex[k].tolist() for k in ("inputs", "targets") if k in ex}
            for ex in ds.as_numpy_iterator()
        ]
    return results


if __name__ == "__main__":
    oracle_main(compute)
