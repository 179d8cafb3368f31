"""The autoscaling policy's configuration: one frozen section, every field with unit, default, example.

Defaults are the work-based policy from the design: scale out by 25 % when KV occupancy is above
0.8 *and* TTFT p95 above 1.5 s for 60 s; scale in by 10 % when occupancy is below 0.35 *and* TTFT
p95 below 0.4 s for 600 s. Token-rate sizing is off until per-replica capacities are measured and
configured (a guessed capacity would drive the fleet on a made-up number). ``pools`` overrides the
whole policy for named pools; every other pool uses ``policy``.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from kvgate.config.base import Frozen

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


class ScheduleWindow(Frozen):
    """Fewest replicas during a window of the week, in UTC: an operator's foresight, cron-like."""

    days: str = Field(
        default="mon-sun",
        description="Weekdays of the window: names, ranges, commas or *. Default mon-sun. Example: mon-fri",
    )
    start: str = Field(description="Start of the window, HH:MM UTC. Example: 08:30")
    end: str = Field(
        description="End of the window, HH:MM UTC; at or before start, it ends the next day. Example: 18:00"
    )
    min_replicas: int = Field(ge=0, description="Fewest replicas within the window. Example: 6")

    @field_validator("start", "end")
    @classmethod
    def _clock_time(cls, value: str) -> str:
        if not re.fullmatch(r"([01]\d|2[0-3]):[0-5]\d", value):
            raise ValueError(f"expected HH:MM (UTC), got {value!r}")
        return value

    @field_validator("days")
    @classmethod
    def _weekdays(cls, value: str) -> str:
        weekdays(value)
        return value


def weekdays(spec: str) -> frozenset[int]:
    """Weekday numbers (Monday 0) of a spec such as ``mon-fri``, ``sat,sun`` or ``*``."""
    if spec.strip() == "*":
        return frozenset(range(7))
    out: set[int] = set()
    for part in spec.lower().split(","):
        first, _, last = part.strip().partition("-")
        if first not in WEEKDAYS or (last and last not in WEEKDAYS):
            raise ValueError(f"unknown weekday in {spec!r}; use {', '.join(WEEKDAYS)}, ranges or *")
        a, b = WEEKDAYS.index(first), WEEKDAYS.index(last or first)
        out.update(range(a, b + 1) if a <= b else [*range(a, 7), *range(b + 1)])
    return frozenset(out)


class ForecastPolicy(Frozen):
    """Foresight the policy takes as an input, never below what the present signals ask: the demand
    forecast from the pool's own history, and an operator's schedule of fewest replicas."""

    enabled: bool = Field(
        default=False,
        description=(
            "Forecast the pool's demand over the lead from a seasonal profile of its own history (by "
            "time of day and of week) and ask for it ahead. Default false. Example: true"
        ),
    )
    season_s: float = Field(
        default=86400.0,
        gt=0,
        description=(
            "Period of the demand's daily cycle, seconds; a weekly profile at seven of them is preferred "
            "once it has history. Default 86400. Example: 86400"
        ),
    )
    bucket_s: float = Field(
        default=300.0,
        gt=0,
        description="Width of one slot of the seasonal profile, seconds. Default 300. Example: 60",
    )
    lead_s: float | None = Field(
        default=None,
        gt=0,
        description=(
            "How far ahead the forecast and the schedule ask, seconds; None: cold_start_s. Default None. "
            "Example: 180"
        ),
    )
    smoothing_ratio: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description=(
            "Weight of the latest season in each slot of the profile (the rest is the seasons before), "
            "0..1. Default 0.5. Example: 0.3"
        ),
    )
    trend_window_s: float = Field(
        default=120.0,
        gt=0,
        description=(
            "Seconds of recent demand whose least-squares line gives the short-term level the forecast "
            "moves from. Default 120. Example: 300"
        ),
    )
    schedule: tuple[ScheduleWindow, ...] = Field(
        default=(),
        description=(
            "Windows of fewest replicas, asked lead_s ahead, forecast on or off. Default (). Example: "
            "[{days: mon-fri, start: '08:30', end: '18:00', min_replicas: 6}]"
        ),
    )


class PoolPolicy(Frozen):
    min_replicas: int = Field(default=1, ge=0, description="Fewest replicas. Default 1. Example: 2")
    max_replicas: int = Field(default=16, ge=1, description="Most replicas. Default 16. Example: 64")

    scale_out_occupancy_ratio: float = Field(
        default=0.8,
        gt=0,
        le=1,
        description="KV occupancy above which a pool is full, 0..1. Default 0.8. Example: 0.85",
    )
    scale_out_ttft_s: float = Field(
        default=1.5,
        gt=0,
        description="TTFT p95 above which prefill is too slow, seconds. Default 1.5. Example: 2.0",
    )
    scale_out_itl_s: float = Field(
        default=0.1,
        gt=0,
        description="ITL p95 above which decode is too slow, seconds. Default 0.1. Example: 0.05",
    )
    scale_out_queue_wait_s: float = Field(
        default=2.0,
        gt=0,
        description=(
            "Admission-queue wait p95 above which demand exceeds the fleet whatever the other signals say, "
            "seconds. Default 2. Example: 5"
        ),
    )
    scale_out_prefill_tokens_per_replica: int = Field(
        default=16384,
        gt=0,
        description=(
            "Prompt tokens waiting per ready replica above which a prefill pool is backlogged; at or "
            "below it, on a pool within every latency target, they are prompts in flight, which "
            "token-rate sizing's floor counts neither as a backlog nor as arrivals left unserved, "
            "tokens. Default 16384. Example: 32768"
        ),
    )
    scale_out_window_s: float = Field(
        default=60.0,
        gt=0,
        description="Seconds a scale-out condition must hold without a break. Default 60. Example: 30",
    )
    scale_out_step_ratio: float = Field(
        default=0.25,
        gt=0,
        description="Fraction of current replicas added per scale-out (at least one). Default 0.25.",
    )

    scale_in_occupancy_ratio: float = Field(
        default=0.35,
        ge=0,
        le=1,
        description="KV occupancy below which a pool is idle, 0..1. Default 0.35. Example: 0.3",
    )
    scale_in_ttft_s: float = Field(
        default=0.4, gt=0, description="TTFT p95 below which prefill is fast, seconds. Default 0.4."
    )
    scale_in_itl_s: float = Field(
        default=0.03, gt=0, description="ITL p95 below which decode is fast, seconds. Default 0.03."
    )
    scale_in_prefill_tokens_per_replica: int = Field(
        default=2048,
        ge=0,
        description="Prompt tokens waiting per ready replica below which prefill is idle. Default 2048.",
    )
    scale_in_window_s: float = Field(
        default=600.0,
        gt=0,
        description="Seconds a scale-in condition must hold without a break. Default 600. Example: 900",
    )
    scale_in_step_ratio: float = Field(
        default=0.10,
        gt=0,
        lt=1,
        description="Fraction of current replicas removed per scale-in (at least one). Default 0.1.",
    )
    scale_down_delay_s: float = Field(
        default=300.0,
        ge=0,
        description=(
            "Seconds after any scale-out before a scale-in may happen (stabilisation). "
            "Default 300. Example: 600"
        ),
    )

    scale_in_hysteresis_replicas: float = Field(
        default=0.5,
        ge=0,
        description=(
            "With capacities configured, the pool scales in to ceil((R / C + h) / "
            "target_utilization_ratio), R projected over the cold start (the sizing window's trend "
            "line now, or the sample's own where higher), once that is below the current "
            "count for scale_in_sizing_window_s with latencies under their scale-out targets; h is "
            "twice the standard deviation of R / C around its trend over that window, at most this: "
            "the hysteresis in replicas' worth of work, as the noise is (a margin in utilisation is "
            "narrower than the noise of 60 s rates on a small pool and wider than it on a large one), "
            "replicas. Default 0.5. Example: 1"
        ),
    )
    scale_in_sizing_window_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Seconds the projected rates must fit fewer replicas, without a break, before a scale-in "
            "to them. Default 60. Example: 120"
        ),
    )
    target_utilization_ratio: float = Field(
        default=0.75,
        gt=0,
        le=1,
        description="U_target in N = ceil(R / (C x U_target)), 0..1. Default 0.75. Example: 0.7",
    )
    prefill_capacity_tokens_per_s: float | None = Field(
        default=None,
        gt=0,
        description=(
            "C for prefill: prompt tokens/s one replica sustains; None disables. Default None. Example: 20000"
        ),
    )
    decode_capacity_tokens_per_s: float | None = Field(
        default=None,
        gt=0,
        description=(
            "C for decode: output tokens/s one replica sustains; None disables. Default None. Example: 2500"
        ),
    )
    decode_sequences_per_replica: int | None = Field(
        default=None,
        gt=0,
        description=(
            "Resident sequences one decode replica holds within its ITL target; None disables. "
            "Default None. Example: 64"
        ),
    )
    cold_start_s: float = Field(
        default=120.0,
        ge=0,
        description=(
            "Seconds from asking for a replica to it serving at speed. Sizes headroom (growth rate x "
            "cold start) and how long the policy waits for asked-for replicas before asking again. "
            "Default 120. Example: 300"
        ),
    )
    backlog_drain_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Seconds in which token-rate sizing should also clear the prompt backlog replicas asked for "
            "now will find when they serve: the prompt tokens waiting plus those arriving unserved over "
            "cold_start_s, divided by this, is added to the prefill rate sized (not while asked-for "
            "replicas come up). Default 60. Example: 120"
        ),
    )
    growth_window_s: float = Field(
        default=60.0,
        gt=0,
        description="Seconds over which the token-rate growth is measured. Default 60. Example: 30",
    )
    forecast: ForecastPolicy = Field(
        default_factory=ForecastPolicy,
        description="Foresight: a learned demand forecast (off by default), a schedule of fewest replicas.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> PoolPolicy:
        problems = []
        if self.min_replicas > self.max_replicas:
            problems.append(f"min_replicas {self.min_replicas} > max_replicas {self.max_replicas}")
        if self.scale_in_occupancy_ratio >= self.scale_out_occupancy_ratio:
            problems.append("scale_in_occupancy_ratio must be below scale_out_occupancy_ratio (ratio)")
        if self.scale_in_ttft_s >= self.scale_out_ttft_s:
            problems.append("scale_in_ttft_s must be below scale_out_ttft_s (seconds)")
        if self.scale_in_itl_s >= self.scale_out_itl_s:
            problems.append("scale_in_itl_s must be below scale_out_itl_s (seconds)")
        if self.scale_in_prefill_tokens_per_replica >= self.scale_out_prefill_tokens_per_replica:
            problems.append(
                "scale_in_prefill_tokens_per_replica must be below scale_out_prefill_tokens_per_replica"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


class AutoscalerConfig(Frozen):
    interval_s: float = Field(
        default=15.0, gt=0, description="Seconds between two reads of the signals. Default 15. Example: 5"
    )
    signals_window_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Seconds of events behind the gateway's /signals rates and latency quantiles, the policy's "
            "view of the pool; keep it at or below scale_out_window_s. Default 60. Example: 30"
        ),
    )
    policy: PoolPolicy = Field(default_factory=PoolPolicy, description="Policy for every pool not in pools.")
    pools: dict[str, PoolPolicy] = Field(
        default_factory=dict,
        description="Per-pool policies by pool name. Default {}. Example: {decode: {max_replicas: 8}}",
    )

    def policy_for(self, pool: str) -> PoolPolicy:
        return self.pools.get(pool, self.policy)
