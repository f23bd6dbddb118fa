"""The contract between the generic core (trainer, data checks, evaluation, inference,
checkpoints, FLOPs) and a model family: every member the core reads is declared here, so the
core neither probes with `hasattr` nor switches on a family's name.

A family is a `ModelConfig` subclass (registered under its `FAMILY` name when the class is
defined, which is how a checkpoint's JSON finds its config again) and one or more `Model`
subclasses that wrap a Flax module with its loss:

* `init`/`abstract_params` give the parameters (boxed with logical axis names);
* `feature_converter` turns a seqio task's examples into the model's fixed-shape batches and
  `FEATURES` lists the features the model reads;
* `loss_sums` returns *un-normalised* sums (they add up over micro-batches) and
  `loss_denominators` the divisor of each summed loss term, computed from the whole batch before
  it is split; the training objective is `sum(sums[k] / denominators[k])`, so gradient
  accumulation equals the full-batch step exactly, even for a loss of several differently
  normalised terms (BERT's masked-LM mean over predictions plus NSP mean over sequences);
* `metrics` turns sums (of one batch or of many) into the reported numbers; every family
  reports `loss` and `accuracy`;
* a model that generates text names the feature its prompt goes in as (`PROMPT_FEATURE`) and
  implements `predict_batch` and `score_batch`; a classification head leaves it None and
  is scored by its predictions (`predict`) instead.

t5x's `BaseModel` and Levanter's `LmConfig` play the same part there.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, cast

import flax.linen as nn
import jax
import numpy as np

from t5x_like.errors import ConfigError

if TYPE_CHECKING:  # seqio imports TensorFlow (~0.9 GB): only the data pipeline needs it
    import seqio

    from t5x_like.data.task_heads import Head

Array = jax.Array
Batch = Mapping[str, Array]
Params = Any

# Checkpoints written before configs recorded their family hold T5 configs.
UNLABELLED_FAMILY = "t5"
# The modules whose configs register the built-in families; a new family adds its own (or is
# imported by the user's gin file before a checkpoint of it is read).
BUILT_IN_FAMILIES = (
    "t5x_like.families.t5.network",
    "t5x_like.families.bert.network",
    "t5x_like.families.gpt.network",
)
# The model the entry points build when a run binds no `model_class` (as in t5x, T5's
# encoder-decoder), named so that the core imports no family to default to it.
DEFAULT_MODEL_CLASS = "t5x_like.families.t5.model.EncoderDecoderModel"

_FAMILIES: dict[str, type[ModelConfig]] = {}


class ModelConfig:
    """A family's dimensions (a frozen dataclass in each family). Subclasses set `FAMILY`
    and are registered by it; `ARCHITECTURE_FIELDS` are the fields that decide parameter shapes
    and meaning (a checkpoint must agree on them; dropout or dtype may differ)."""

    FAMILY: ClassVar[str] = ""
    ARCHITECTURE_FIELDS: ClassVar[tuple[str, ...]] = ()
    scan_layers: bool  # layers stacked under one `nn.scan` (checkpoints.scan_layout)
    vocab_size: int  # rows of the embedding table: a task's vocabulary must fit in them

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.FAMILY:
            _FAMILIES[cls.FAMILY] = cls

    @property
    def position_limit(self) -> int | None:
        """How many positions the model can represent (a learned table's size), or None when
        any length is (relative or sinusoidal positions)."""
        return None

    def forward_flops(self, feature_lengths: Mapping[str, int]) -> int | None:
        """Hand-counted forward FLOPs of one example at a task's feature lengths
        (`t5x_like.flops` has the per-part formulas); None leaves MFU unreported."""
        return None

    def to_json(self) -> dict:
        """Plain JSON-able fields, as stored beside checkpoints, with the family's name."""
        fields = {k: list(v) if isinstance(v, tuple) else v for k, v in _fields(self).items()}
        return {"family": self.FAMILY, **fields}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelConfig:
        return cls(**{k: v for k, v in data.items() if k != "family"})


def _fields(config: Any) -> dict[str, Any]:
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


def families() -> dict[str, type[ModelConfig]]:
    """The registered families by name (a family registers when its config module is
    imported)."""
    for module in BUILT_IN_FAMILIES:
        importlib.import_module(module)
    return dict(_FAMILIES)


def config_from_json(data: Mapping[str, Any]) -> ModelConfig:
    """The config a checkpoint's JSON describes, of the family its `"family"` names."""
    family = data.get("family", UNLABELLED_FAMILY)
    known = families()
    if family not in known:
        raise ConfigError(
            f"The checkpoint's config is of family {family!r}, which is not registered "
            f"(known: {sorted(known)}); import the module that defines its config first."
        )
    return known[family].from_json(data)


def default_model_class() -> type[Model]:
    """The model class of a run that binds none (`DEFAULT_MODEL_CLASS`)."""
    module, _, name = DEFAULT_MODEL_CLASS.rpartition(".")
    return getattr(importlib.import_module(module), name)


def unbox(params: Params) -> Params:
    """Plain arrays from a tree of logically-partitioned boxes."""
    return nn.meta.unbox(params)


def count_params(params: Params) -> int:
    """Number of scalars in a (possibly boxed or abstract) parameter tree."""
    leaves = jax.tree_util.tree_leaves(nn.meta.unbox(params))
    return int(sum(np.prod(x.shape) for x in leaves))


class Model:
    """What the core reads from a model object. Subclasses implement the methods that
    raise here; the attributes have the defaults of a model that does not need them."""

    config: ModelConfig
    FEATURES: ClassVar[tuple[str, ...]] = ()
    # The feature a prompt's token ids go in as when the model generates; None for a model
    # that predicts labels, not text (a classification head).
    PROMPT_FEATURE: ClassVar[str | None] = None
    # Whether the prompt and the new tokens share one sequence (a decoder-only model), so
    # together they must fit `config.position_limit`.
    PROMPT_SHARES_SEQUENCE: ClassVar[bool] = False
    # Top-level parameter collections the optimizer leaves untouched (feature-based BERT).
    frozen_modules: tuple[str, ...] = ()
    # A fine-tuning head's output count (1 for a regression head); None for none.
    num_labels: int | None = None
    # The id that ends a generated sequence (this codebase's vocabularies: 1); None for a
    # model without one (OpenAI's GPT-1).
    eos_id: int | None = 1

    @property
    def is_regression(self) -> bool:
        """Whether the head predicts one number per example (STS-B) instead of a label."""
        return False

    def init(self, rng: Array) -> Params:
        raise NotImplementedError

    def abstract_params(self) -> Params:
        return jax.eval_shape(self.init, jax.random.key(0))

    def feature_converter(self, pack: bool) -> seqio.FeatureConverter:
        raise NotImplementedError

    def loss_sums(
        self, params: Params, batch: Batch, dropout_rng: Array | None = None
    ) -> dict[str, Array]:
        raise NotImplementedError

    def loss_denominators(self, batch: Batch) -> dict[str, Array]:
        raise NotImplementedError

    def metrics(self, sums: Mapping[str, Array]) -> dict[str, Array]:
        raise NotImplementedError

    def predict_batch(self, params: Params, batch: Batch, max_decode_length: int, **kwargs: Any):
        """Generated tokens (and with `return_scores=True` their log-likelihoods)."""
        raise NotImplementedError(f"{type(self).__name__} does not generate text")

    def score_batch(self, params: Params, batch: Batch) -> Array:
        """Each example's log-likelihood of its targets."""
        raise NotImplementedError(f"{type(self).__name__} does not score targets")

    def predict(self, params: Params, batch: Batch) -> Any:
        """A head's prediction per example (label index, regression value or tag per token)."""
        raise NotImplementedError(f"{type(self).__name__} does not predict labels")

    def evaluate_task(
        self,
        params: Params,
        task_name: str,
        split: str,
        feature_lengths: Mapping[str, int],
        batch_size: int,
        max_examples: int | None = None,
    ) -> dict[str, float] | None:
        """The task's metrics on `split`, for a head whose score needs more than one
        prediction per example (SQuAD's answer combines the spans of a question's windows);
        None, the default, leaves it to `classifier_eval`, which compares each example's
        `predict` with its label."""
        return None

    def check_task_head(self, task_name: str, head: Head) -> None:
        """Refuse a task whose head (`data.task_heads`) this model cannot train: by default the
        label count must equal the model's outputs."""
        if self.num_labels is not None and head.num_labels is not None:
            if head.num_labels != self.num_labels:
                kind = "1 (regression)" if head.num_labels == 1 else str(head.num_labels)
                raise ConfigError(
                    f"Task {task_name!r} has {kind} labels but the model's head has "
                    f"{self.num_labels} outputs; bind {type(self).__name__}.num_labels = "
                    f"{head.num_labels}."
                )


def objective(sums: Mapping[str, Array], denominators: Mapping[str, Array]) -> Array:
    """The training loss: each summed term over its own divisor."""
    return cast(Array, sum(sums[k] / denominators[k] for k in denominators))
