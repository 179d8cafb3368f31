from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from kvgate.autoscaler.forecast import Forecaster, scheduled_replicas
from kvgate.autoscaler.policy import PoolAutoscaler
from kvgate.autoscaler.recommendation import SCALE_OUT_FORECAST, SCALE_OUT_SCHEDULE
from kvgate.autoscaler.signals import PoolSignals
from kvgate.config.autoscaler import ForecastPolicy, PoolPolicy, weekdays
from kvgate.vocabulary.replica import Role

DAY_S = 600.0
"""A short season: the profile's period is configuration, the arithmetic is the same."""
STEP_S = 15.0
MONDAY_S = 4 * 86400.0
"""1970-01-05, a Monday, 00:00 UTC."""


def policy(**kw: Any) -> ForecastPolicy:
    values: dict[str, Any] = {"enabled": True, "season_s": DAY_S, "bucket_s": 30.0, "trend_window_s": 60.0}
    values.update(kw)
    return ForecastPolicy(**values)


def burst_day(t: float) -> float:
    """2 replicas' worth of demand, 8 from 3:00 to 5:00 of each season."""
    return 8.0 if 180.0 <= t % DAY_S < 300.0 else 2.0


def feed(f: Forecaster, start_s: float, end_s: float, demand: Any = burst_day) -> dict[float, float | None]:
    out = {}
    t = start_s
    while t < end_s:
        f.observe(t, demand(t))
        out[t] = f.forecast(t)
        t += STEP_S
    return out


def test_no_history_no_forecast() -> None:
    f = Forecaster(policy(), lead_s=90.0)
    assert f.forecast(0.0) is None
    first_day = feed(f, 0.0, DAY_S)
    assert all(v is None for t, v in first_day.items() if t + 90.0 < DAY_S)
    assert first_day[DAY_S - STEP_S] == pytest.approx(2.0), "the next season's start was seen today"


def test_a_repeating_step_is_asked_for_one_lead_ahead() -> None:
    f = Forecaster(policy(), lead_s=90.0)
    feed(f, 0.0, DAY_S)
    day2 = feed(f, DAY_S, 2 * DAY_S)
    assert day2[DAY_S + 60.0] == pytest.approx(2.0)
    assert day2[DAY_S + 90.0] == pytest.approx(8.0), "the step at 180 s is within 90 s of 90 s"
    assert day2[DAY_S + 200.0 - 5.0] == pytest.approx(8.0)


def test_a_step_that_does_not_come_is_dropped_within_the_trend_window() -> None:
    f = Forecaster(policy(), lead_s=90.0)
    feed(f, 0.0, 2 * DAY_S)
    broken = feed(f, 2 * DAY_S, 3 * DAY_S, demand=lambda t: 2.0)
    assert broken[2 * DAY_S + 150.0] == pytest.approx(8.0), "foresight asks before it can know"
    late = [v for t, v in broken.items() if 2 * DAY_S + 180.0 + 60.0 <= t < 2 * DAY_S + 300.0]
    assert late and all(v is not None and v <= 2.0 + 1e-9 for v in late)


def test_a_profile_slot_learns_from_seasons_before_its_own() -> None:
    f = Forecaster(policy(smoothing_ratio=0.5), lead_s=30.0)
    feed(f, 0.0, DAY_S, demand=lambda t: 4.0)
    feed(f, DAY_S, 2 * DAY_S, demand=lambda t: 2.0)
    assert f.profile(2 * DAY_S + 15.0) == pytest.approx(3.0)
    assert f.profile(DAY_S + 15.0) == pytest.approx(4.0), "the day's own samples are not its history"


def test_the_forecast_error_is_measured_once_its_lead_has_passed() -> None:
    f = Forecaster(policy(), lead_s=90.0)
    feed(f, 0.0, 2 * DAY_S)
    broken = feed(f, 2 * DAY_S, 2 * DAY_S + 255.0, demand=lambda t: 2.0)
    made_s = 2 * DAY_S + 150.0
    assert broken[made_s] == pytest.approx(8.0)
    f.observe(made_s + 90.0 + 15.0, 2.0)
    assert f.errors > 0
    assert f.last_error_replicas is not None and f.last_error_replicas > 0, "it over-forecast"


def test_weekdays_spec() -> None:
    assert weekdays("mon-fri") == frozenset(range(5))
    assert weekdays("sat,sun") == frozenset({5, 6})
    assert weekdays("fri-mon") == frozenset({4, 5, 6, 0})
    assert weekdays("*") == frozenset(range(7))
    with pytest.raises(ValueError, match="unknown weekday"):
        weekdays("monday")


def test_schedule_window_validation_names_the_value() -> None:
    with pytest.raises(ValidationError, match="25:00"):
        ForecastPolicy(schedule=[{"start": "25:00", "end": "18:00", "min_replicas": 3}])


@pytest.mark.parametrize(
    ("at_s", "expected"),
    [
        (MONDAY_S + 8 * 3600.0, 0),
        (MONDAY_S + 8.5 * 3600.0 - 120.0, 6),
        (MONDAY_S + 12 * 3600.0, 6),
        (MONDAY_S + 18 * 3600.0, 0),
        (MONDAY_S + 5 * 86400.0 + 12 * 3600.0, 0),
        (MONDAY_S + 4 * 86400.0 + 23.5 * 3600.0, 2),
        (MONDAY_S + 5 * 86400.0 + 1 * 3600.0, 2),
    ],
    ids=[
        "monday-early",
        "lead-before-open",
        "monday-noon",
        "closed",
        "saturday",
        "friday-night",
        "past-midnight",
    ],
)
def test_schedule_windows(at_s: float, expected: int) -> None:
    p = ForecastPolicy(
        schedule=[
            {"days": "mon-fri", "start": "08:30", "end": "18:00", "min_replicas": 6},
            {"days": "fri", "start": "23:00", "end": "02:00", "min_replicas": 2},
        ]
    )
    assert scheduled_replicas(p, at_s, lead_s=180.0) == expected


def signals(t: float, replicas: int, demand: float) -> PoolSignals:
    """A calm mixed pool serving ``demand`` replicas' worth of prompt tokens at 1,000 tokens/s each."""
    return PoolSignals(
        time_s=t,
        pool="chat",
        role=Role.MIXED,
        replicas_current=replicas,
        replicas_ready=replicas,
        kv_occupancy_ratio=0.3,
        ttft_p95_s=0.2,
        itl_p95_s=0.02,
        queue_wait_p95_s=None,
        prompt_tokens_queued=0,
        resident_sequences=0,
        prompt_tokens_per_s=demand * 1000.0,
        output_tokens_per_s=0.0,
    )


def test_the_policy_takes_the_forecast_as_an_input_never_below_the_present() -> None:
    pool = PolicyRun(forecast=policy(lead_s=90.0))
    pool.days(0.0, DAY_S)
    answers = pool.days(DAY_S, 2 * DAY_S)
    ahead = [a for t, a in answers if DAY_S + 90.0 <= t < DAY_S + 180.0]
    assert ahead and all(a.desired_replicas >= 8 for a in ahead)
    assert any(a.reason == SCALE_OUT_FORECAST for a in ahead)
    assert all(a.forecast_replicas is not None for _, a in answers)


def test_forecast_off_by_default() -> None:
    assert PoolPolicy().forecast.enabled is False
    pool = PolicyRun(forecast=ForecastPolicy())
    pool.days(0.0, DAY_S)
    answers = pool.days(DAY_S, 2 * DAY_S)
    before = [a for t, a in answers if DAY_S + 90.0 <= t < DAY_S + 180.0]
    assert before and all(a.desired_replicas < 8 and a.forecast_replicas is None for a in before)


def test_the_schedule_lifts_the_ask_one_lead_ahead() -> None:
    window = {"days": "*", "start": "00:05", "end": "00:08", "min_replicas": 5}
    pool = PolicyRun(forecast=ForecastPolicy(lead_s=60.0, schedule=[window]))
    answers = dict(pool.days(0.0, 600.0, demand=lambda t: 1.0))
    assert answers[240.0].desired_replicas == 5 and answers[240.0].reason == SCALE_OUT_SCHEDULE
    assert answers[225.0].desired_replicas < 5


class PolicyRun:
    """One mixed pool, its replicas following the advice at once."""

    def __init__(self, forecast: ForecastPolicy) -> None:
        self.scaler = PoolAutoscaler(
            "chat",
            PoolPolicy(
                max_replicas=16,
                cold_start_s=90.0,
                prefill_capacity_tokens_per_s=1000.0,
                target_utilization_ratio=1.0,
                forecast=forecast,
            ),
        )
        self.replicas = 2

    def days(self, start_s: float, end_s: float, demand: Any = burst_day) -> list[tuple[float, Any]]:
        out = []
        t = start_s
        while t < end_s:
            answer = self.scaler.update(signals(t, self.replicas, demand(t)))
            self.replicas = answer.desired_replicas
            out.append((t, answer))
            t += STEP_S
        return out


def test_a_pool_bound_by_its_cache_sizes_on_the_prompts_waiting_for_it() -> None:
    """Long contexts queue behind a fragmented cache that reads under the full mark: the ready
    replicas serve at their ceiling, and the queue's growth says how far short they are."""
    scaler = PoolAutoscaler(
        "chat",
        PoolPolicy(
            max_replicas=16,
            cold_start_s=90.0,
            prefill_capacity_tokens_per_s=27000.0,
            decode_capacity_tokens_per_s=2000.0,
        ),
    )
    answers = []
    for i in range(8):
        s = signals(float(i * STEP_S), 4, 0.0)
        queued = 20_000 + 8_000 * i
        answers.append(
            scaler.update(
                PoolSignals(
                    **{
                        **{f: getattr(s, f) for f in PoolSignals.__slots__},
                        "kv_occupancy_ratio": 0.7,
                        "ttft_p95_s": 1.2,
                        "prompt_tokens_queued": queued,
                        "prompt_tokens_per_s": 20_000.0,
                        "output_tokens_per_s": 1_000.0,
                    }
                )
            )
        )
    asked = next(a for a in answers if a.desired_replicas > 4)
    assert asked.reason == "scale_out_kv" and "kv_bound->" in asked.detail
    assert all(a.desired_replicas == 4 for a in answers[:2]), "a queue under the mark is in flight"


def test_a_pool_bound_by_compute_is_not_sized_on_its_cache() -> None:
    scaler = PoolAutoscaler(
        "chat", PoolPolicy(max_replicas=16, cold_start_s=90.0, prefill_capacity_tokens_per_s=27000.0)
    )
    for i in range(8):
        s = signals(float(i * STEP_S), 4, 0.0)
        answer = scaler.update(
            PoolSignals(
                **{
                    **{f: getattr(s, f) for f in PoolSignals.__slots__},
                    "kv_occupancy_ratio": 0.5,
                    "ttft_p95_s": 1.2,
                    "prompt_tokens_queued": 40_000 + 8_000 * i,
                    "prompt_tokens_per_s": 90_000.0,
                }
            )
        )
        assert "kv_bound" not in answer.detail
