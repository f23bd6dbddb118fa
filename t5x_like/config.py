"""Gin configuration: parse files and command-line bindings, build the configured objects.

Command-line bindings may give plain strings without quotes (`MODEL_DIR=/tmp/run`): a value that
is not a Python literal, a gin reference (`@name`, `%MACRO`) or a container is quoted for the
user, so nobody has to escape quotes in a shell.
"""

from __future__ import annotations

import ast
import dataclasses
import os
from typing import Sequence, TypeVar

import gin

from t5x_like.models.t5 import T5Config


class ConfigError(ValueError):
    """A configuration or input that cannot work; the message says what to change."""


@dataclasses.dataclass(frozen=True)
class Number:
    """What a numeric run setting accepts: its type, its least value (`above`: strictly more
    than it), and whether None (off / automatic) is allowed."""

    kind: type = int
    minimum: float | None = None
    above: float | None = None
    maximum: float | None = None
    optional: bool = False

    def check(self, binding: str, value) -> None:
        """Raise ConfigError naming the binding when `value` is not acceptable."""
        if value is None and self.optional:
            return
        kinds = (int,) if self.kind is int else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds):
            noun = "an integer" if self.kind is int else "a number"
            raise ConfigError(f"--gin.{binding} must be {noun}{self._range()}"
                              f"{' or None' if self.optional else ''}, not {value!r}.")
        if ((self.minimum is not None and value < self.minimum)
                or (self.above is not None and value <= self.above)
                or (self.maximum is not None and value > self.maximum)):
            raise ConfigError(f"--gin.{binding} must be{self._range()}, not {value!r}.")

    def _range(self) -> str:
        parts = [f">= {self.minimum:g}" if self.minimum is not None else "",
                 f"> {self.above:g}" if self.above is not None else "",
                 f"<= {self.maximum:g}" if self.maximum is not None else ""]
        return "".join(f" {p}" for p in parts if p)


def check_numbers(scope: str, values: dict, rules: dict[str, Number]) -> None:
    """Check each setting in `rules` of the configurable `scope` (its gin name)."""
    for name, rule in rules.items():
        rule.check(f"{scope}.{name}", values[name])


def quote_plain_string(binding: str) -> str:
    """`KEY=value` -> `KEY='value'` when `value` would not parse as a gin value."""
    if "=" not in binding:
        raise ValueError(f"Gin binding {binding!r} has no '='; write it as KEY=VALUE.")
    key, value = binding.split("=", 1)
    stripped = value.strip()
    if not stripped or stripped[0] in "@%[({'\"":
        return binding
    try:
        ast.literal_eval(stripped)
        return binding
    except (ValueError, SyntaxError):
        if stripped in ("True", "False", "None"):
            return binding
        return f"{key}={stripped!r}"


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def register_configurables() -> None:
    """Import every module that defines gin configurables, so any of them can be bound."""
    import tasks  # noqa: F401  (bert_vocab_path, c4_files, text_corpus, ...)
    from t5x_like import (decoding, distributed, infer, optimizers,  # noqa: F401
                          partitioning, preemption, squad_eval, train)
    from t5x_like import eval as _eval  # noqa: F401
    from t5x_like.models import bert_models, encoder_decoder, gpt_finetune  # noqa: F401

    register_model_configurables()


def register_model_configurables() -> None:
    """Import the modules that define the model config classes (T5Config, BertConfig,
    GPTConfig), all that a model gin file binds. Unlike `register_configurables` this leaves
    out the tasks, whose seqio imports TensorFlow: ~0.7 GB of host memory that a benchmark or
    the memory planner, reading only a model config, would otherwise carry."""
    from t5x_like.models import bert, decoder_only  # noqa: F401


def parse_gin(gin_files: Sequence[str] = (), bindings: Sequence[str] = (), *,
              models_only: bool = False) -> None:
    """Parse gin files, then bindings (later ones override earlier ones). `include` lines
    may name files relative to the repository root, whatever the working directory. With
    `models_only`, only the model config classes can be bound (`register_model_configurables`).
    """
    if models_only:
        register_model_configurables()
    else:
        register_configurables()
    if REPO_ROOT not in gin.config._LOCATION_PREFIXES:  # noqa: SLF001 - gin has no getter
        gin.add_config_file_search_path(REPO_ROOT)
    gin.parse_config_files_and_bindings(
        list(gin_files), [quote_plain_string(b) for b in bindings], finalize_config=False)


def load_model_config(gin_files: Sequence[str] = (), bindings: Sequence[str] = (),
                      config_class: type = T5Config):
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


ConfigT = TypeVar("ConfigT")


def bind_over(config: ConfigT, bindings: Sequence[str]) -> ConfigT:
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
