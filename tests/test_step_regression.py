"""The step-regression check's verdict and its refusal of an unknown revision (the timed run
itself is a benchmark: `python -m benchmarks.step_regression --base REV`)."""

import pytest

from benchmarks import step_regression


def test_a_consistent_slowdown_beyond_the_tolerance_is_a_regression():
    assert step_regression.verdict([1.06, 1.08, 1.05, 1.07, 1.09, 1.04], 0.03)["regression"]


def test_noise_around_one_is_not():
    ratios = [0.93, 1.07, 1.02, 0.97, 1.05, 0.96, 1.01, 0.99]
    result = step_regression.verdict(ratios, 0.03)
    assert not result["regression"]
    assert result["ratio_q1"] < 1.0 < result["ratio_q3"]


def test_a_slowdown_within_the_tolerance_is_not():
    assert not step_regression.verdict([1.01, 1.02, 1.015, 1.02, 1.01], 0.03)["regression"]


def test_a_speedup_is_not():
    assert not step_regression.verdict([0.8, 0.82, 0.79, 0.81], 0.03)["regression"]


def test_an_unknown_base_revision_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="not a commit"):
        step_regression.extract("no-such-revision-xyz", str(tmp_path))
