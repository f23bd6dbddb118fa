"""Gin registration and parsing, for the entry points: import every module that defines a
configurable, then parse gin files and command-line bindings (later ones override earlier ones).

Only entry points (train, eval, infer, plan, benchmarks, tests) call this; library modules never
import it, so the package's module-level imports form no cycle (tests/test_import_structure.py).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Any, Sequence

import gin

from t5x_like.config import quote_plain_string
from t5x_like.families.t5.network import T5Config

# Gin files are named `gin_configs/...` (on the command line and in `include` lines): relative to
# the working directory, else to a checkout's root (REPO_ROOT/gin_configs) or to the installed
# package, which ships them as t5x_like/gin_configs (pyproject.toml).
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(PACKAGE_DIR)
GIN_SEARCH_PATH = (REPO_ROOT, PACKAGE_DIR)


def find_gin_file(path: str) -> str | None:
    """`path` itself when it exists, else the shipped gin file it names (`gin_configs/...`
    under the checkout or the installed package); None when there is none."""
    if os.path.exists(path):
        return path
    if os.path.isabs(path):
        return None
    for root in GIN_SEARCH_PATH:
        candidate = os.path.join(root, path)
        if os.path.exists(candidate):
            return candidate
    return None


# Every module that defines gin configurables: this repository's tasks (bert_vocab_path,
# c4_files, text_corpus, ...), the run entry points and what they configure, the models.
CONFIGURABLE_MODULES = (
    "t5x_like.tasks",
    "t5x_like.decoding",
    "t5x_like.distributed",
    "t5x_like.eval",
    "t5x_like.infer",
    "t5x_like.optimizers",
    "t5x_like.partitioning",
    "t5x_like.preemption",
    "t5x_like.families.bert.squad_eval",
    "t5x_like.train",
    "t5x_like.train_settings",
    "t5x_like.families.bert.model",
    "t5x_like.families.t5.model",
    "t5x_like.families.gpt.model",
    "t5x_like.families.gpt.finetune",
)
MODEL_CONFIG_MODULES = (
    "t5x_like.families.t5.network",
    "t5x_like.families.bert.network",
    "t5x_like.families.gpt.network",
)


def register_configurables() -> None:
    """Import every module that defines gin configurables, so any of them can be bound."""
    for module in CONFIGURABLE_MODULES:
        importlib.import_module(module)
    register_model_configurables()


def register_model_configurables() -> None:
    """Import the modules that define the model config classes (T5Config, BertConfig,
    GPTConfig), all that a model gin file binds. Unlike `register_configurables` this leaves
    out the tasks, whose seqio imports TensorFlow: ~0.7 GB of host memory that a benchmark or
    the memory planner, reading only a model config, would otherwise carry."""
    for module in MODEL_CONFIG_MODULES:
        importlib.import_module(module)


def parse_gin(
    gin_files: Sequence[str] = (), bindings: Sequence[str] = (), *, models_only: bool = False
) -> None:
    """Parse gin files, then bindings (later ones override earlier ones). `include` lines
    may name files relative to the repository root, whatever the working directory. With
    `models_only`, only the model config classes can be bound (`register_model_configurables`).
    """
    if models_only:
        register_model_configurables()
    else:
        register_configurables()
    for root in GIN_SEARCH_PATH:
        if root not in gin.config._LOCATION_PREFIXES:  # noqa: SLF001 - gin has no getter
            gin.add_config_file_search_path(root)
    gin.parse_config_files_and_bindings(
        list(gin_files), [quote_plain_string(b) for b in bindings], finalize_config=False
    )


def load_model_config(
    gin_files: Sequence[str] = (), bindings: Sequence[str] = (), config_class: type = T5Config
):
    """A model config (T5Config unless `config_class` says e.g. BertConfig) from gin files and
    bindings, starting from a clean gin state."""
    _parse_for_model_config(gin_files, bindings)
    return config_class()


def _parse_for_model_config(gin_files: Sequence[str], bindings: Sequence[str]) -> None:
    """Parse gin from a clean state for reading a model config: with the model config classes
    alone when that is all the files and bindings name (a model gin file, `--gin
    T5Config....`), so TensorFlow is not imported; else (a run's gin file, a binding of a
    task's or the decoder's setting) with every configurable, where a binding nothing defines
    fails as usual.
    """
    gin.clear_config()
    try:
        parse_gin(gin_files, bindings, models_only=True)
    except ValueError:
        gin.clear_config()
        parse_gin(gin_files, bindings)


def bind_over(config: Any, bindings: Sequence[str]) -> Any:
    """`config` (a model config dataclass) with the fields that gin `bindings` of its class set
    replaced, the rest as they were: bindings as edits of a given config rather than of the
    class defaults (`load_model_config`)."""
    if not bindings:
        return config
    cls = type(config)
    _parse_for_model_config((), bindings)
    bound = cls()
    changes = {}
    for field in dataclasses.fields(cls):
        try:
            gin.query_parameter(f"{cls.__name__}.{field.name}")
        except ValueError:  # not bound
            continue
        changes[field.name] = getattr(bound, field.name)
    return dataclasses.replace(config, **changes)
