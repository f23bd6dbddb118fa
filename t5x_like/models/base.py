"""What the training loop needs from a model family, whatever its architecture.

T5 (`EncoderDecoderModel`), BERT pretraining (`BertPretrainingModel`) and the BERT fine-tuning
heads all satisfy this protocol, so `trainer` and `train` hold no family-specific code:

* `init`/`abstract_params` give the parameters (boxed with logical axis names);
* `feature_converter` turns a seqio task's examples into the model's fixed-shape batches and
  `FEATURES` lists the features the model reads;
* `loss_sums` returns *un-normalised* sums (they add up over micro-batches) and
  `loss_denominators` the divisor of each summed loss term, computed from the whole batch before
  it is split; the training objective is `sum(sums[k] / denominators[k])`, so gradient
  accumulation equals the full-batch step exactly, even for a loss of several differently
  normalised terms (BERT's masked-LM mean over predictions plus NSP mean over sequences);
* `metrics` turns sums (of one batch or of many) into the reported numbers; every family
  reports `loss` and `accuracy`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Protocol

import jax

if TYPE_CHECKING:  # seqio imports TensorFlow (~0.9 GB): only the data pipeline needs it
    import seqio

Array = jax.Array
Batch = Mapping[str, Array]
Params = Any


class Model(Protocol):
    config: Any
    FEATURES: tuple[str, ...]

    def init(self, rng: Array) -> Params: ...

    def abstract_params(self) -> Params: ...

    def feature_converter(self, pack: bool) -> seqio.FeatureConverter: ...

    def loss_sums(
        self, params: Params, batch: Batch, dropout_rng: Array | None = None
    ) -> dict[str, Array]: ...

    def loss_denominators(self, batch: Batch) -> dict[str, Array]: ...

    def metrics(self, sums: Mapping[str, Array]) -> dict[str, Array]: ...


def objective(sums: Mapping[str, Array], denominators: Mapping[str, Array]) -> Array:
    """The training loss: each summed term over its own divisor."""
    return sum(sums[k] / denominators[k] for k in denominators)
