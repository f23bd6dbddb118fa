"""BERT's pretraining model and fine-tuning models for the training loop (`base.Model`).

Each wraps one Flax module of `bert.py` with the loss the paper trains it on and the
feature converter that builds its batches:

* `BertPretrainingModel`: masked-LM cross-entropy averaged over the predicted positions plus
  next-sentence cross-entropy averaged over the sequences (the reference's `total_loss`);
* `BertClassifierModel`: GLUE-style classification on the pooled [CLS], or regression (one
  output, mean squared error) for STS-B;
* `BertMultipleChoiceModel`: SWAG, a softmax over the choices' scores;
* `BertSpanModel`: SQuAD, start and end cross-entropies averaged;
* `BertTaggerModel`: CoNLL NER, a label per scored token, fine-tuned or feature-based.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Mapping

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp

from t5x_like import losses
from t5x_like.families.bert import network as bert
from t5x_like.models import base

if TYPE_CHECKING:
    from t5x_like.families.bert import features as bert_features


def _features() -> Any:
    """`t5x_like.families.bert.features`, imported when a data pipeline asks for a converter: it
    builds on seqio, which imports TensorFlow (~0.9 GB of host memory) the model itself never
    needs."""
    from t5x_like.families.bert import features as bert_features

    return bert_features


Array = jax.Array
Batch = Mapping[str, Array]
Params = Any

# The reference's masked-LM denominator: sum(weights) + 1e-5 (a batch with no prediction
# gives a zero loss instead of a division by zero).
_MLM_EPSILON = 1e-5


def _xent(logits: Array, labels: Array) -> Array:
    """Cross-entropy per example (float32)."""
    return losses.cross_entropy_with_logits(logits, labels.astype(jnp.int32))[0]


def _correct(logits: Array, labels: Array) -> Array:
    """Whether the argmax is the label (`losses.target_is_argmax`: argmax's own reduction
    took ~75 ms of the standard BERT benchmark step on CPU)."""
    return losses.target_is_argmax(logits, labels.astype(jnp.int32)).astype(jnp.float32)


class _BertWrapper(base.Model):
    """What every BERT model shares: the config (BertConfig() from gin when not given), the
    Flax module, parameter creation and the forward pass on a batch."""

    FEATURES: ClassVar[tuple[str, ...]] = ("input_ids", "segment_ids", "input_mask")
    config: bert.BertConfig

    def __init__(self, config: bert.BertConfig | None = None) -> None:
        self.config = config if config is not None else bert.BertConfig()
        self.module = self._make_module()

    def _make_module(self) -> nn.Module:
        raise NotImplementedError

    def _example_inputs(self) -> tuple[Array, ...]:
        return (jnp.ones((1, 8), jnp.int32),)

    def init(self, rng: Array) -> Params:
        return self.module.init(rng, *self._example_inputs())["params"]

    def abstract_params(self) -> Params:
        return jax.eval_shape(self.init, jax.random.key(0))

    def apply(
        self, params: Params, batch: Batch, dropout_rng: Array | None = None, **kwargs: Any
    ) -> Any:
        rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
        return self.module.apply(
            {"params": params},
            batch["input_ids"],
            batch.get("segment_ids"),
            batch.get("input_mask"),
            deterministic=dropout_rng is None,
            rngs=rngs,
            **kwargs,
        )


@gin.configurable
class BertPretrainingModel(_BertWrapper):
    """Masked LM + next sentence prediction (section 3.1)."""

    FEATURES = _BertWrapper.FEATURES + (
        "masked_lm_positions",
        "masked_lm_ids",
        "masked_lm_weights",
        "next_sentence_labels",
    )

    def _make_module(self) -> nn.Module:
        return bert.BertForPreTraining(self.config)

    def feature_converter(self, pack: bool) -> bert_features.PretrainingFeatureConverter:
        del pack  # BERT's examples are single sentence pairs, never packed
        return _features().PretrainingFeatureConverter()

    def loss_sums(
        self, params: Params, batch: Batch, dropout_rng: Array | None = None
    ) -> dict[str, Array]:
        out = self.apply(params, batch, dropout_rng, masked_positions=batch["masked_lm_positions"])
        weights = batch["masked_lm_weights"].astype(jnp.float32)
        labels = batch["masked_lm_ids"]
        nsp_labels = batch["next_sentence_labels"]
        return {
            "mlm_loss_sum": jnp.sum(_xent(out["mlm_logits"], labels) * weights),
            "mlm_correct": jnp.sum(_correct(out["mlm_logits"], labels) * weights),
            "mlm_weight": jnp.sum(weights),
            "nsp_loss_sum": jnp.sum(_xent(out["nsp_logits"], nsp_labels)),
            "nsp_correct": jnp.sum(_correct(out["nsp_logits"], nsp_labels)),
            "nsp_count": jnp.asarray(nsp_labels.shape[0], jnp.float32),
        }

    def loss_denominators(self, batch: Batch) -> dict[str, Array]:
        return {
            "mlm_loss_sum": jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)) + _MLM_EPSILON,
            "nsp_loss_sum": jnp.asarray(batch["next_sentence_labels"].shape[0], jnp.float32),
        }

    def metrics(self, sums: Mapping[str, Array]) -> dict[str, Array]:
        mlm_weight = jnp.maximum(sums["mlm_weight"], 1.0)
        nsp_count = jnp.maximum(sums["nsp_count"], 1.0)
        mlm_loss = sums["mlm_loss_sum"] / mlm_weight
        nsp_loss = sums["nsp_loss_sum"] / nsp_count
        return {
            "loss": mlm_loss + nsp_loss,
            "mlm_loss": mlm_loss,
            "accuracy": sums["mlm_correct"] / mlm_weight,
            "nsp_loss": nsp_loss,
            "nsp_accuracy": sums["nsp_correct"] / nsp_count,
            "masked_tokens": jnp.asarray(sums["mlm_weight"]),
        }


class _ExampleLossModel(_BertWrapper):
    """Fine-tuning models whose loss is a mean over examples; `label_weights` (0 for the
    padding rows of a final evaluation batch) keep padding out of every sum."""

    def loss_denominators(self, batch: Batch) -> dict[str, Array]:
        return {"loss_sum": jnp.maximum(jnp.sum(_example_weights(batch)), 1.0)}

    def metrics(self, sums: Mapping[str, Array]) -> dict[str, Array]:
        count = jnp.maximum(sums["count"], 1.0)
        return {
            "loss": sums["loss_sum"] / count,
            "accuracy": sums["correct"] / count,
            "examples": jnp.asarray(sums["count"]),
        }

    def _sums(self, example_loss: Array, example_correct: Array, batch: Batch) -> dict[str, Array]:
        w = _example_weights(batch)
        return {
            "loss_sum": jnp.sum(example_loss * w),
            "correct": jnp.sum(example_correct * w),
            "count": jnp.sum(w),
        }


def _example_weights(batch: Batch) -> Array:
    weights = batch.get("label_weights")
    if weights is None:
        return jnp.ones(batch["input_ids"].shape[0], jnp.float32)
    return weights.astype(jnp.float32)


@gin.configurable
class BertClassifierModel(_ExampleLossModel):
    """Sentence(-pair) classification, or regression when `num_labels == 1` (STS-B), where
    `accuracy` is reported as 0 and the task's Pearson/Spearman metrics are what count."""

    FEATURES = _BertWrapper.FEATURES + ("label", "label_weights")
    num_labels: int

    def __init__(self, config: bert.BertConfig | None = None, num_labels: int = 2) -> None:
        self.num_labels = num_labels
        super().__init__(config)

    def _make_module(self) -> nn.Module:
        return bert.BertForSequenceClassification(self.config, self.num_labels)

    def feature_converter(self, pack: bool) -> bert_features.ClassificationFeatureConverter:
        del pack
        return _features().ClassificationFeatureConverter()

    @property
    def is_regression(self) -> bool:
        return self.num_labels == 1

    def loss_sums(
        self, params: Params, batch: Batch, dropout_rng: Array | None = None
    ) -> dict[str, Array]:
        logits = self.apply(params, batch, dropout_rng)
        labels = batch["label"]
        if self.is_regression:
            error = logits[:, 0].astype(jnp.float32) - labels.astype(jnp.float32)
            return self._sums(jnp.square(error), jnp.zeros_like(error), batch)
        return self._sums(_xent(logits, labels), _correct(logits, labels), batch)

    def predict(self, params: Params, batch: Batch) -> Array:
        """Class ids, or scores for regression."""
        logits = self.apply(params, batch)
        return logits[:, 0] if self.is_regression else jnp.argmax(logits, -1)


@gin.configurable
class BertMultipleChoiceModel(_ExampleLossModel):
    """SWAG: inputs (batch, choices, length), label = the right choice's index."""

    FEATURES = _BertWrapper.FEATURES + ("label", "label_weights")

    def __init__(self, config: bert.BertConfig | None = None, num_choices: int = 4) -> None:
        self.num_choices = num_choices
        super().__init__(config)

    def _make_module(self) -> nn.Module:
        return bert.BertForMultipleChoice(self.config)

    def _example_inputs(self) -> tuple[Array, ...]:
        return (jnp.ones((1, self.num_choices, 8), jnp.int32),)

    def feature_converter(self, pack: bool) -> bert_features.MultipleChoiceFeatureConverter:
        del pack
        return _features().MultipleChoiceFeatureConverter(self.num_choices)

    def loss_sums(
        self, params: Params, batch: Batch, dropout_rng: Array | None = None
    ) -> dict[str, Array]:
        scores = self.apply(params, batch, dropout_rng)
        labels = batch["label"]
        return self._sums(_xent(scores, labels), _correct(scores, labels), batch)

    def predict(self, params: Params, batch: Batch) -> Array:
        return jnp.argmax(self.apply(params, batch), -1)


@gin.configurable
class BertSpanModel(_ExampleLossModel):
    """SQuAD: loss = (start cross-entropy + end cross-entropy) / 2 (the reference's); an
    unanswerable (v2.0) example points both at [CLS], position 0. `accuracy` counts examples
    whose start and end are both right."""

    FEATURES = _BertWrapper.FEATURES + ("start_position", "end_position", "label_weights")

    def _make_module(self) -> nn.Module:
        return bert.BertForQuestionAnswering(self.config)

    def feature_converter(self, pack: bool) -> bert_features.SpanFeatureConverter:
        del pack
        return _features().SpanFeatureConverter()

    def loss_sums(
        self, params: Params, batch: Batch, dropout_rng: Array | None = None
    ) -> dict[str, Array]:
        start_logits, end_logits = self.apply(params, batch, dropout_rng)
        start, end = batch["start_position"], batch["end_position"]
        loss = (_xent(start_logits, start) + _xent(end_logits, end)) / 2
        correct = _correct(start_logits, start) * _correct(end_logits, end)
        return self._sums(loss, correct, batch)

    def predict(self, params: Params, batch: Batch) -> tuple[Array, Array]:
        """(start_logits, end_logits) for `squad_spans.best_spans`."""
        return self.apply(params, batch)

    def evaluate_task(
        self,
        params: Params,
        task_name: str,
        split: str,
        feature_lengths: Mapping[str, int],
        batch_size: int,
        max_examples: int | None = None,
    ) -> dict[str, float]:
        """SQuAD's EM and F1 of the answers the windows' spans combine into (`squad_eval`)."""
        from t5x_like.families.bert import squad_eval

        return squad_eval.evaluate_task(
            self, params, task_name, split, feature_lengths, batch_size, max_examples
        )


@gin.configurable
class BertTaggerModel(_BertWrapper):
    """Token classification: cross-entropy averaged over the scored tokens (`label_weights`
    marks each word's first piece). With `feature_based` the encoder is frozen
    (`frozen_modules`, which the optimizer leaves untouched)."""

    FEATURES = _BertWrapper.FEATURES + ("labels", "label_weights")
    num_labels: int

    def __init__(
        self,
        config: bert.BertConfig | None = None,
        num_labels: int = 9,
        feature_based: bool = False,
        lstm_size: int = 768,
    ) -> None:
        self.num_labels = num_labels
        self.feature_based = feature_based
        self.lstm_size = lstm_size
        self.frozen_modules = ("encoder",) if feature_based else ()
        super().__init__(config)

    def _make_module(self) -> nn.Module:
        return bert.BertForTokenClassification(
            self.config, self.num_labels, self.feature_based, self.lstm_size
        )

    def feature_converter(self, pack: bool) -> bert_features.TaggingFeatureConverter:
        del pack
        return _features().TaggingFeatureConverter()

    def loss_sums(
        self, params: Params, batch: Batch, dropout_rng: Array | None = None
    ) -> dict[str, Array]:
        logits = self.apply(params, batch, dropout_rng)
        labels, weights = batch["labels"], batch["label_weights"].astype(jnp.float32)
        return {
            "loss_sum": jnp.sum(_xent(logits, labels) * weights),
            "correct": jnp.sum(_correct(logits, labels) * weights),
            "count": jnp.sum(weights),
        }

    def loss_denominators(self, batch: Batch) -> dict[str, Array]:
        return {"loss_sum": jnp.maximum(jnp.sum(batch["label_weights"].astype(jnp.float32)), 1.0)}

    metrics = _ExampleLossModel.metrics

    def predict(self, params: Params, batch: Batch) -> Array:
        return jnp.argmax(self.apply(params, batch), -1)
