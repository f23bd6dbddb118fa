"""What a run setting accepts (`Number`, `check_numbers`) and how a command-line binding is
read (`quote_plain_string`): the checks every configurable shares.

A leaf beside `errors`: it imports no other module of the package, so any module can check its
settings without pulling in gin registration (`gin_setup`, used by the entry points only).

Command-line bindings may give plain strings without quotes (`MODEL_DIR=/tmp/run`): a value that
is not a Python literal, a gin reference (`@name`, `%MACRO`) or a container is quoted for the
user, so nobody has to escape quotes in a shell.
"""

from __future__ import annotations

import ast
import dataclasses

from t5x_like.errors import ConfigError


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
            raise ConfigError(
                f"--gin.{binding} must be {noun}{self._range()}"
                f"{' or None' if self.optional else ''}, not {value!r}."
            )
        if (
            (self.minimum is not None and value < self.minimum)
            or (self.above is not None and value <= self.above)
            or (self.maximum is not None and value > self.maximum)
        ):
            raise ConfigError(f"--gin.{binding} must be{self._range()}, not {value!r}.")

    def _range(self) -> str:
        parts = [
            f">= {self.minimum:g}" if self.minimum is not None else "",
            f"> {self.above:g}" if self.above is not None else "",
            f"<= {self.maximum:g}" if self.maximum is not None else "",
        ]
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
