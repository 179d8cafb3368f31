import itertools
import random
import statistics

import pytest

from kvgate.loadtest.arrivals import RateStep, arrival_offsets_s, rate_at, segments


def test_same_seed_same_offsets() -> None:
    first = arrival_offsets_s(5.0, 60.0, random.Random(7))
    second = arrival_offsets_s(5.0, 60.0, random.Random(7))
    other = arrival_offsets_s(5.0, 60.0, random.Random(8))
    assert first == second
    assert first != other


def test_offsets_sorted_and_inside_duration() -> None:
    offsets = arrival_offsets_s(20.0, 30.0, random.Random(1), process="gamma", cv=3.0)
    assert offsets == sorted(offsets)
    assert all(0.0 <= t < 30.0 for t in offsets)


def test_poisson_count_and_gap_cv_match_the_rate() -> None:
    offsets = arrival_offsets_s(50.0, 200.0, random.Random(3))
    assert len(offsets) == pytest.approx(50.0 * 200.0, rel=0.05)
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_gaps_have_the_requested_cv(cv: float) -> None:
    offsets = arrival_offsets_s(50.0, 400.0, random.Random(4), process="gamma", cv=cv)
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(cv, rel=0.15)
    assert len(offsets) == pytest.approx(50.0 * 400.0, rel=0.15)


def test_schedule_doubles_arrivals_in_the_burst_window() -> None:
    steps = (RateStep(0.0, 1.0), RateStep(0.5, 2.0))
    offsets = arrival_offsets_s(20.0, 200.0, random.Random(5), steps=steps)
    before = sum(1 for t in offsets if t < 100.0)
    after = len(offsets) - before
    assert after / before == pytest.approx(2.0, rel=0.1)


def test_zero_rate_segment_has_no_arrivals() -> None:
    steps = (RateStep(0.0, 1.0), RateStep(0.25, 0.0), RateStep(0.75, 1.0))
    offsets = arrival_offsets_s(10.0, 100.0, random.Random(6), steps=steps)
    assert not [t for t in offsets if 25.0 <= t < 75.0]
    assert [t for t in offsets if t >= 75.0]


def test_segments_cover_the_duration() -> None:
    schedule = segments(4.0, 30.0, (RateStep(0.5, 3.0),))
    assert [(s.start_s, s.end_s, s.rate_rps) for s in schedule] == [(0.0, 15.0, 4.0), (15.0, 30.0, 12.0)]
    assert rate_at(schedule, 20.0) == 12.0
    assert rate_at(schedule, 30.0) == 0.0


def test_bad_process_fails() -> None:
    with pytest.raises(ValueError, match="poisson"):
        arrival_offsets_s(1.0, 1.0, random.Random(0), process="uniform")  # type: ignore[arg-type]
