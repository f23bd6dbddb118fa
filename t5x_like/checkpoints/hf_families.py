"""Which HuggingFace checkpoints each model family reads and writes.

A family's HuggingFace module (`families/{t5,bert,gpt}/hf.py`) registers one `HuggingFaceFamily`:
the `model_type`s of config.json it imports, its config class (to export one of our
checkpoints), and how it loads, verifies against transformers and exports. `convert` looks a
checkpoint up here, so a new family's conversion is a module of its own, not an edit of
`convert`.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

from t5x_like.errors import CheckpointError

Params = Any

# config.json files written before transformers recorded `model_type` hold T5 models.
UNTYPED_MODEL_TYPE = "t5"
# The modules that register the built-in families' conversions.
BUILT_IN = (
    "t5x_like.families.t5.hf",
    "t5x_like.families.bert.hf",
    "t5x_like.families.gpt.hf",
)


@dataclasses.dataclass(frozen=True)
class HuggingFaceFamily:
    """`load(directory) -> (config, params)`; `verify(directory, config, params)` -> the largest
    absolute difference from transformers' PyTorch model per output (needs the test extra);
    `export(directory, params, config, hf_architecture)` -> (a function that writes the
    directory, the HF architecture it writes); `tokenizer(directory, model_type)` -> the
    tokenizer files in the directory ({name: path}) and the description of the vocabulary they
    make (see `tokenizer_files`), or None when the directory has none."""

    model_types: tuple[str, ...]
    config_class: type
    load: Callable[[str], tuple[Any, Params]]
    verify: Callable[[str, Any, Params], dict[str, float]]
    export: Callable[[str, Params, Any, str | None], tuple[Callable[[], object], str]]
    tokenizer: Callable[[str, str], tuple[dict[str, str], dict[str, Any]] | None] = (
        lambda directory, model_type: None
    )


_REGISTERED: list[HuggingFaceFamily] = []


def register(family: HuggingFaceFamily) -> HuggingFaceFamily:
    _REGISTERED.append(family)
    return family


def registered() -> list[HuggingFaceFamily]:
    """Every registered family: the built-in ones first, in `BUILT_IN`'s order (so messages
    list them the same way whichever a process imported first), then the others in the order
    they registered."""
    for module in BUILT_IN:
        importlib.import_module(module)
    order = {module: i for i, module in enumerate(BUILT_IN)}
    return sorted(_REGISTERED, key=lambda f: order.get(f.load.__module__, len(BUILT_IN)))


def supported_model_types() -> list[str]:
    return [t for family in registered() for t in family.model_types]


def for_model_type(model_type: str) -> HuggingFaceFamily:
    """The family that imports config.json's `model_type`."""
    for family in registered():
        if model_type in family.model_types:
            return family
    raise CheckpointError(
        f"config.json model_type={model_type!r}; supported: {', '.join(supported_model_types())}."
    )


def for_config(config: Any) -> HuggingFaceFamily:
    """The family that exports a checkpoint of `config`'s class."""
    for family in registered():
        if isinstance(config, family.config_class):
            return family
    raise CheckpointError(
        f"No HuggingFace export for a {type(config).__name__} checkpoint; the families that "
        f"export are those of {', '.join(f.config_class.__name__ for f in registered())}."
    )
