"""`benchmarks.step_program` calls two compiled programs the same exactly when XLA's optimized HLO
differs only in where the code lives (op names, source files and lines, the module's name).
Checked on XLA's own output for functions compiled here, not on hand-written HLO."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from benchmarks import step_program


def _scaled_sum(x):
    return jnp.sum(jnp.tanh(x) * 3.0)


def _scaled_sum_elsewhere(x):  # the same computation, defined on other lines under another name
    return jnp.sum(jnp.tanh(x) * 3.0)


def _scaled_sum_of_squares(x):  # one op different
    return jnp.sum(jnp.square(x) * 3.0)


def _hlo(fn) -> str:
    return jax.jit(fn).lower(jnp.ones((4, 8), jnp.float32)).compile().as_text()


def test_the_same_computation_from_other_source_lines_is_the_same_program():
    raw_a, raw_b = _hlo(_scaled_sum), _hlo(_scaled_sum_elsewhere)
    assert raw_a != raw_b  # names and source lines differ in XLA's text
    assert "source_line" in raw_a or "op_name" in raw_a
    result = step_program.compare_programs(
        step_program.canonical_hlo(raw_a), step_program.canonical_hlo(raw_b)
    )
    assert result["same_program"] and result["diff_head"] == []
    assert result["base_sha256"] == result["head_sha256"]


def test_a_different_op_is_a_different_program():
    result = step_program.compare_programs(
        step_program.canonical_hlo(_hlo(_scaled_sum)),
        step_program.canonical_hlo(_hlo(_scaled_sum_of_squares)),
    )
    assert not result["same_program"]
    changed = [
        line
        for line in result["diff_head"]
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert any("tanh" in line for line in changed)
    assert any("multiply" in line for line in changed)  # square is x * x after optimization


def test_canonical_text_keeps_every_instruction():
    raw = _hlo(_scaled_sum)
    canonical = step_program.canonical_hlo(raw)

    def instructions(text: str) -> int:
        return sum(line.strip().startswith(("%", "ROOT")) for line in text.splitlines())

    assert "metadata=" not in canonical and "FileLocations" not in canonical
    assert instructions(canonical) == instructions(raw) > 0
