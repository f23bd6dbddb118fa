"""seqio feature converters from BERT tasks' examples to the BERT models' batches.

The tasks' preprocessors (`bert_preprocessors`) already frame each example the BERT way
(`[CLS] A [SEP] B [SEP]`, segment ids, masking); the converters pad every feature to the
lengths the run asks for, add `input_mask` (1 on real tokens) and per-example loss weights,
and let seqio check the result's names, ranks, dtypes and exact lengths. Nothing is packed:
BERT sees one sequence (pair) per row, with learned absolute positions.

Task feature lengths:
  pretraining      {"inputs": max_seq_length, "targets": max_predictions_per_seq}
  classification,
  span, tagging    {"inputs": max_seq_length}
  multiple choice  {"inputs": max_seq_length} (per choice)
"""

from __future__ import annotations

from typing import Mapping, TypeAlias

import seqio
import tensorflow as tf

Spec: TypeAlias = seqio.FeatureConverter.FeatureSpec
INT, FLOAT = tf.int32, tf.float32


class _BertConverter(seqio.FeatureConverter):
    """Shared plumbing: never packs, and `input_mask` from the padded token ids."""

    PACKING_FEATURE_DTYPES = None

    def __init__(self) -> None:
        super().__init__(pack=False)

    @staticmethod
    def _with_mask(features: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        features["input_mask"] = tf.cast(features["input_ids"] != 0, INT)
        return features


class PretrainingFeatureConverter(_BertConverter):
    """Masked inputs + the original ids at the predicted positions (the task's `targets`)."""

    TASK_FEATURES = {"inputs": Spec(INT), "targets": Spec(INT)}
    MODEL_FEATURES = {
        "input_ids": Spec(INT),
        "segment_ids": Spec(INT),
        "input_mask": Spec(INT),
        "masked_lm_positions": Spec(INT),
        "masked_lm_ids": Spec(INT),
        "masked_lm_weights": Spec(FLOAT),
        "next_sentence_labels": Spec(INT, rank=0),
    }

    def _convert_features(
        self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]
    ) -> tf.data.Dataset:
        length, predictions = task_feature_lengths["inputs"], task_feature_lengths["targets"]
        ds = seqio.utils.trim_and_pad_dataset(
            ds,
            {
                "inputs": length,
                "segment_ids": length,
                "targets": predictions,
                "masked_lm_positions": predictions,
            },
        )

        def convert(ex):
            return self._with_mask(
                {
                    "input_ids": ex["inputs"],
                    "segment_ids": ex["segment_ids"],
                    "masked_lm_positions": ex["masked_lm_positions"],
                    "masked_lm_ids": ex["targets"],
                    # Position 0 is [CLS], never predicted: a 0 position is padding.
                    "masked_lm_weights": tf.cast(ex["masked_lm_positions"] > 0, FLOAT),
                    "next_sentence_labels": ex["next_sentence_labels"],
                }
            )

        return ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)

    def get_model_feature_lengths(
        self, task_feature_lengths: Mapping[str, int]
    ) -> Mapping[str, int]:
        length, predictions = task_feature_lengths["inputs"], task_feature_lengths["targets"]
        return {
            "input_ids": length,
            "segment_ids": length,
            "input_mask": length,
            "masked_lm_positions": predictions,
            "masked_lm_ids": predictions,
            "masked_lm_weights": predictions,
            "next_sentence_labels": 1,
        }


class _SequenceConverter(_BertConverter):
    """One framed sequence per example plus scalar targets named by `SCALARS`."""

    TASK_FEATURES = {"inputs": Spec(INT)}
    SCALARS: dict[str, tf.dtypes.DType] = {}

    @property
    def MODEL_FEATURES(self) -> dict[str, Spec]:  # noqa: N802 - seqio's attribute name
        features = {
            "input_ids": Spec(INT),
            "segment_ids": Spec(INT),
            "input_mask": Spec(INT),
            "label_weights": Spec(FLOAT, rank=0),
        }
        features.update({k: Spec(dtype, rank=0) for k, dtype in self.SCALARS.items()})
        return features

    def _convert_features(
        self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]
    ) -> tf.data.Dataset:
        length = task_feature_lengths["inputs"]
        ds = seqio.utils.trim_and_pad_dataset(ds, {"inputs": length, "segment_ids": length})

        def convert(ex):
            out = {
                "input_ids": ex["inputs"],
                "segment_ids": ex["segment_ids"],
                "label_weights": tf.constant(1.0, FLOAT),
            }
            out.update({k: tf.cast(ex[k], dtype) for k, dtype in self.SCALARS.items()})
            return self._with_mask(out)

        return ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)

    def get_model_feature_lengths(
        self, task_feature_lengths: Mapping[str, int]
    ) -> Mapping[str, int]:
        length = task_feature_lengths["inputs"]
        lengths = {
            "input_ids": length,
            "segment_ids": length,
            "input_mask": length,
            "label_weights": 1,
        }
        lengths.update(dict.fromkeys(self.SCALARS, 1))
        return lengths


class ClassificationFeatureConverter(_SequenceConverter):
    """`label`: a class id, or a float score for regression (kept as float32 for both)."""

    SCALARS = {"label": FLOAT}


class SpanFeatureConverter(_SequenceConverter):
    """`start_position`/`end_position`: token indices of the answer (0 = [CLS] = none)."""

    SCALARS = {"start_position": INT, "end_position": INT}


class MultipleChoiceFeatureConverter(_BertConverter):
    """Each example holds `num_choices` framed sequences, (choices, length)."""

    TASK_FEATURES = {"inputs": Spec(INT, rank=2, sequence_dim=1)}
    MODEL_FEATURES = {
        "input_ids": Spec(INT, rank=2, sequence_dim=1),
        "segment_ids": Spec(INT, rank=2, sequence_dim=1),
        "input_mask": Spec(INT, rank=2, sequence_dim=1),
        "label": Spec(FLOAT, rank=0),
        "label_weights": Spec(FLOAT, rank=0),
    }

    def __init__(self, num_choices: int) -> None:
        self.num_choices = num_choices
        super().__init__()

    def _convert_features(
        self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]
    ) -> tf.data.Dataset:
        shape = (self.num_choices, task_feature_lengths["inputs"])
        ds = seqio.utils.trim_and_pad_dataset(ds, {"inputs": shape, "segment_ids": shape})

        def convert(ex):
            return self._with_mask(
                {
                    "input_ids": ex["inputs"],
                    "segment_ids": ex["segment_ids"],
                    "label": tf.cast(ex["label"], FLOAT),
                    "label_weights": tf.constant(1.0, FLOAT),
                }
            )

        return ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)

    def get_model_feature_lengths(
        self, task_feature_lengths: Mapping[str, int]
    ) -> Mapping[str, int]:
        length = task_feature_lengths["inputs"]
        return {
            "input_ids": length,
            "segment_ids": length,
            "input_mask": length,
            "label": 1,
            "label_weights": 1,
        }


class TaggingFeatureConverter(_BertConverter):
    """A label per token; `label_weights` is 1 on each word's first piece, 0 elsewhere."""

    TASK_FEATURES = {"inputs": Spec(INT)}
    MODEL_FEATURES = {
        "input_ids": Spec(INT),
        "segment_ids": Spec(INT),
        "input_mask": Spec(INT),
        "labels": Spec(INT),
        "label_weights": Spec(FLOAT),
    }

    def _convert_features(
        self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]
    ) -> tf.data.Dataset:
        length = task_feature_lengths["inputs"]
        ds = seqio.utils.trim_and_pad_dataset(
            ds, dict.fromkeys(("inputs", "segment_ids", "labels", "label_weights"), length)
        )

        def convert(ex):
            return self._with_mask(
                {
                    "input_ids": ex["inputs"],
                    "segment_ids": ex["segment_ids"],
                    "labels": ex["labels"],
                    "label_weights": tf.cast(ex["label_weights"], FLOAT),
                }
            )

        return ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)

    def get_model_feature_lengths(
        self, task_feature_lengths: Mapping[str, int]
    ) -> Mapping[str, int]:
        length = task_feature_lengths["inputs"]
        return dict.fromkeys(self.MODEL_FEATURES, length)
