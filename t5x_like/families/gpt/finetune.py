"""GPT-1 fine-tuning (Radford et al., 2018, sections 3.2-3.3): a linear head
on the final state of the learned extract token, trained with the auxiliary LM loss.

Inputs come framed by `gpt_preprocessors` with the start / delimiter / extract tokens (embedding
rows after the vocabulary, `GPTConfig.num_special_tokens`). Every input is one or more token
sequences per example:

* classification and entailment: one sequence, `[start] a ([delim] b) [extract]`;
* similarity: both orderings of the pair, (2, length); the two extract states are summed
  element-wise before the linear layer, so the prediction cannot depend on the order;
* multiple choice: one sequence per candidate, (choices, length); the linear layer scores each
  extract state and a softmax over the candidates gives the answer.

Loss L3 = L2 + lm_coef * L1 (the paper's lambda = 0.5): L2 the task's cross-entropy (mean
squared error for a one-output regression head) averaged over examples, L1 the language-model
cross-entropy of each sequence averaged over its real tokens, then over the sequences (as the
reference code does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import gin
import jax
import jax.numpy as jnp

from t5x_like import losses
from t5x_like.errors import ConfigError
from t5x_like.families.bert import features as bert_features
from t5x_like.families.bert.model import _example_weights
from t5x_like.families.gpt.network import DecoderOnly, GPTConfig
from t5x_like.models import base, layers

if TYPE_CHECKING:
    from t5x_like.data.task_heads import Head

Array = jax.Array
Batch = Mapping[str, Array]
Params = Any
COMBINE = ("single", "sum_orderings", "choices")


class GPTForFineTuning(DecoderOnly):
    """The decoder-only network (same parameter names, so a pretrained LM checkpoint grafts
    onto it) plus `classifier`: extract-token state -> dropout -> linear."""

    num_outputs: int = 2
    combine: str = "single"
    classifier_dropout: float = 0.1

    def setup(self) -> None:
        super().setup()
        self.classifier = layers.Dense(
            (self.num_outputs,),
            ("embed",),
            ("classes",),
            use_bias=True,
            kernel_init=layers.normal(self.config.initializer_range),
        )
        self.classifier_dropout_layer = layers.Dropout(self.classifier_dropout)

    def __call__(
        self, input_ids: Array, input_mask: Array, deterministic: bool = True
    ) -> tuple[Array, Array]:
        """(task logits, LM logits). input_ids (batch, length) or (batch, n, length); the task
        logits are (batch, num_outputs), or (batch, choices) for multiple choice."""
        length = input_ids.shape[-1]
        flat_ids = input_ids.reshape(-1, length)
        flat_mask = input_mask.reshape(-1, length)
        hidden = self.hidden_states(flat_ids, deterministic=deterministic)
        lm_logits = self.logits_from_hidden(hidden).astype(jnp.float32)
        extract = jnp.maximum(jnp.sum(flat_mask, axis=-1) - 1, 0)  # the last real token
        state = jnp.take_along_axis(hidden, extract[:, None, None], axis=1)[:, 0]
        state = state.reshape(input_ids.shape[:-1] + (hidden.shape[-1],))
        if self.combine == "sum_orderings":
            state = jnp.sum(state, axis=1)
        state = self.classifier_dropout_layer(state, deterministic=deterministic)
        logits = self.classifier(state).astype(jnp.float32)
        if self.combine == "choices":
            logits = logits[..., 0]
        return logits, lm_logits.reshape(input_ids.shape + (lm_logits.shape[-1],))


def language_model_loss(lm_logits: Array, input_ids: Array, input_mask: Array) -> Array:
    """Per sequence: mean next-token cross-entropy over its real tokens after the first."""
    length = input_ids.shape[-1]
    logits = lm_logits.reshape(-1, length, lm_logits.shape[-1])[:, :-1]
    targets = input_ids.reshape(-1, length)[:, 1:]
    mask = input_mask.reshape(-1, length)[:, 1:].astype(jnp.float32)
    token_loss = losses.cross_entropy_with_logits(logits, targets)[0]
    per_sequence = jnp.sum(token_loss * mask, -1) / jnp.maximum(jnp.sum(mask, -1), 1.0)
    return per_sequence.reshape(input_ids.shape[:-1])


@gin.configurable
class GPTClassifierModel(base.Model):
    """GPT-1 fine-tuning for the trainer (`base.Model`). `combine`: 'single' (classification,
    entailment; one sequence), 'sum_orderings' (similarity; two orderings) or 'choices'
    (multiple choice; `num_choices` sequences). `num_labels == 1` is regression (STS-B)."""

    FEATURES = ("input_ids", "input_mask", "label", "label_weights")

    def __init__(
        self,
        config: GPTConfig | None = None,
        num_labels: int = 2,
        combine: str = "single",
        num_choices: int = 4,
        lm_coef: float = 0.5,
        classifier_dropout: float = 0.1,
    ) -> None:
        if combine not in COMBINE:
            raise ValueError(f"GPTClassifierModel.combine={combine!r}; choose one of {COMBINE}.")
        self.config = config if config is not None else GPTConfig()
        self.num_labels = 1 if combine == "choices" else num_labels
        self.combine = combine
        self.num_choices = num_choices
        self.lm_coef = lm_coef
        self.module = GPTForFineTuning(
            self.config,
            num_outputs=self.num_labels,
            combine=combine,
            classifier_dropout=classifier_dropout,
        )

    @property
    def sequences_per_example(self) -> int:
        return {"single": 1, "sum_orderings": 2, "choices": self.num_choices}[self.combine]

    @property
    def is_regression(self) -> bool:
        return self.combine != "choices" and self.num_labels == 1

    def check_task_head(self, task_name: str, head: Head) -> None:
        """A GPT-1 task also fixes how its sequences combine and needs the start, delimiter
        and extract tokens; a multiple-choice head scores each candidate, so it has no label
        count to match."""
        name = type(self).__name__
        if head.combine is not None:
            if head.combine != self.combine:
                raise ConfigError(
                    f"Task {task_name!r} frames its inputs for {name}.combine = "
                    f"{head.combine!r}, not {self.combine!r}; bind that."
                )
            if self.config.num_special_tokens < 3:
                raise ConfigError(
                    f"Task {task_name!r} uses GPT-1's start, delimiter and "
                    "extract tokens; bind GPTConfig.num_special_tokens = 3."
                )
            if self.combine == "choices":
                return
        super().check_task_head(task_name, head)

    def init(self, rng: Array) -> Params:
        n = self.sequences_per_example
        shape = (1, 8) if self.combine == "single" else (1, n, 8)
        return self.module.init(rng, jnp.ones(shape, jnp.int32), jnp.ones(shape, jnp.int32))[
            "params"
        ]

    def abstract_params(self) -> Params:
        return jax.eval_shape(self.init, jax.random.key(0))

    def feature_converter(self, pack: bool):
        del pack  # one framed example per row, as the paper
        if self.combine == "single":
            return bert_features.ClassificationFeatureConverter()
        return bert_features.MultipleChoiceFeatureConverter(self.sequences_per_example)

    def apply(
        self, params: Params, batch: Batch, dropout_rng: Array | None = None
    ) -> tuple[Array, Array]:
        rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
        return self.module.apply(
            {"params": params},
            batch["input_ids"],
            batch["input_mask"],
            deterministic=dropout_rng is None,
            rngs=rngs,
        )

    def loss_sums(
        self, params: Params, batch: Batch, dropout_rng: Array | None = None
    ) -> dict[str, Array]:
        logits, lm_logits = self.apply(params, batch, dropout_rng)
        weights = _example_weights(batch)
        labels = batch["label"]
        if self.is_regression:
            example_loss = jnp.square(logits[:, 0] - labels.astype(jnp.float32))
            correct = jnp.zeros_like(example_loss)
        else:
            example_loss = losses.cross_entropy_with_logits(logits, labels.astype(jnp.int32))[0]
            correct = (jnp.argmax(logits, -1) == labels.astype(jnp.int32)).astype(jnp.float32)
        lm = language_model_loss(lm_logits, batch["input_ids"], batch["input_mask"])
        lm = lm.reshape(lm.shape[0], -1)  # (batch, sequences per example)
        lm_sum = jnp.sum(lm * weights[:, None])
        return {
            "loss_sum": jnp.sum(example_loss * weights),
            "correct": jnp.sum(correct * weights),
            "count": jnp.sum(weights),
            "lm_loss_sum": lm_sum,
            "weighted_lm_loss_sum": self.lm_coef * lm_sum,
        }

    def loss_denominators(self, batch: Batch) -> dict[str, Array]:
        examples = jnp.maximum(jnp.sum(_example_weights(batch)), 1.0)
        denominators = {"loss_sum": examples}
        if self.lm_coef:
            denominators["weighted_lm_loss_sum"] = examples * self.sequences_per_example
        return denominators

    def metrics(self, sums: Mapping[str, Array]) -> dict[str, Array]:
        count = jnp.maximum(sums["count"], 1.0)
        task_loss = sums["loss_sum"] / count
        lm_loss = sums["lm_loss_sum"] / (count * self.sequences_per_example)
        return {
            "loss": task_loss + self.lm_coef * lm_loss,
            "task_loss": task_loss,
            "lm_loss": lm_loss,
            "accuracy": sums["correct"] / count,
            "examples": jnp.asarray(sums["count"]),
        }

    def predict(self, params: Params, batch: Batch) -> Array:
        """Class ids (the chosen candidate for multiple choice), or scores for regression."""
        logits, _ = self.apply(params, batch)
        return logits[:, 0] if self.is_regression else jnp.argmax(logits, -1)
