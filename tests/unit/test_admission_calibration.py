from __future__ import annotations

import pytest

from kvgate.admission.calibration import Calibration, OutputLengths


def test_prompt_ratio_overall_and_smoothed() -> None:
    calibration = Calibration(prompt_ratio_alpha=0.5)
    assert calibration.prompt("m") is None
    calibration.observe_prompt("m", estimated_tokens=110, actual_tokens=100)
    calibration.observe_prompt("m", estimated_tokens=90, actual_tokens=100)
    seen = calibration.prompt("m")
    assert seen is not None
    assert (seen.requests, seen.estimated_tokens_total, seen.actual_tokens_total) == (2, 200, 200)
    assert seen.ratio == 1.0
    assert seen.ratio_ewma == pytest.approx(1.0)
    calibration.observe_prompt("m", estimated_tokens=5, actual_tokens=0)  # no usage reported: ignored
    assert calibration.prompt("m") == seen


def test_expected_remaining_uses_learned_lengths_capped_by_max() -> None:
    lengths = OutputLengths()
    assert lengths.expected_remaining_tokens(0, 1000) == 1000.0  # nothing learned: worst case
    for _ in range(100):
        lengths.observe(100)
    assert lengths.expected_remaining_tokens(0, 1000) == pytest.approx(100.0)
    assert lengths.expected_remaining_tokens(40, 1000) == pytest.approx(60.0)
    assert lengths.expected_remaining_tokens(0, 30) == pytest.approx(30.0)
    assert lengths.expected_remaining_tokens(150, 1000) == 850.0  # longer than anything seen: worst case
    assert lengths.expected_remaining_tokens(1000, 1000) == 0.0


def test_expected_remaining_is_conditional_on_progress() -> None:
    lengths = OutputLengths()
    for length in [10] * 50 + [500] * 50:
        lengths.observe(length)
    assert lengths.expected_remaining_tokens(0, 2000) == pytest.approx(255, rel=0.1)
    assert lengths.expected_remaining_tokens(20, 2000) == pytest.approx(480, rel=0.1)


def test_recent_traffic_dominates_and_memory_is_bounded() -> None:
    lengths = OutputLengths(half_life_requests=50)
    for _ in range(5000):
        lengths.observe(1000)
    for _ in range(500):
        lengths.observe(20)
    assert lengths.expected_remaining_tokens(0, 4000) < 50
    assert lengths.quantile_tokens(0.5) == pytest.approx(20, rel=0.25)
    assert lengths.observed == 5500
    assert len(lengths._counts) == len(OutputLengths()._counts)


def test_per_model_outputs() -> None:
    calibration = Calibration()
    for _ in range(20):
        calibration.observe_output("a", 10)
    assert calibration.expected_remaining_tokens("a", 0, 100) == pytest.approx(10.0)
    assert calibration.expected_remaining_tokens("b", 0, 100) == 100.0
    assert calibration.models() == ["a"]
