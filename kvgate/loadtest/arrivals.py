"""Arrival times for an open-loop run: a renewal process stretched over a piecewise rate schedule.

Gaps are drawn for a unit-rate process (exponential for Poisson, gamma with a coefficient of
variation for burstier or smoother traffic) and mapped onto real time through the integrated rate
of the schedule (time rescaling), so a schedule that doubles the rate doubles the arrivals in that
window without changing the process's shape. The result depends only on the arguments and the
``random.Random`` passed in: one seed, one list of offsets.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

Process = Literal["poisson", "gamma"]


@dataclass(frozen=True, slots=True)
class RateStep:
    """From ``at_ratio`` of the run's duration on, the rate is ``rate_x`` times the base rate."""

    at_ratio: float
    rate_x: float


@dataclass(frozen=True, slots=True)
class Segment:
    start_s: float
    end_s: float
    rate_rps: float


def segments(base_rate_rps: float, duration_s: float, steps: tuple[RateStep, ...] = ()) -> list[Segment]:
    """The schedule as constant-rate segments covering ``[0, duration_s)``."""
    if duration_s <= 0:
        return []
    ordered = sorted(steps, key=lambda step: step.at_ratio)
    if not ordered or ordered[0].at_ratio > 0:
        ordered.insert(0, RateStep(0.0, 1.0))
    out: list[Segment] = []
    for i, step in enumerate(ordered):
        start_s = min(max(step.at_ratio, 0.0), 1.0) * duration_s
        end_s = duration_s if i + 1 == len(ordered) else min(ordered[i + 1].at_ratio, 1.0) * duration_s
        if end_s > start_s:
            out.append(Segment(start_s, end_s, max(base_rate_rps * step.rate_x, 0.0)))
    return out


def rate_at(schedule: list[Segment], t_s: float) -> float:
    for segment in schedule:
        if segment.start_s <= t_s < segment.end_s:
            return segment.rate_rps
    return 0.0


def arrival_offsets_s(
    base_rate_rps: float,
    duration_s: float,
    rng: random.Random,
    *,
    process: Process = "poisson",
    cv: float = 1.0,
    steps: tuple[RateStep, ...] = (),
) -> list[float]:
    """Sorted send offsets in ``[0, duration_s)`` for the given rate schedule."""
    if process not in ("poisson", "gamma"):
        raise ValueError(f"arrival process must be 'poisson' or 'gamma', got {process!r}")
    if cv <= 0:
        raise ValueError(f"cv must be > 0, got {cv}")
    schedule = segments(base_rate_rps, duration_s, steps)
    offsets: list[float] = []
    shape = 1.0 / (cv * cv)
    work = 0.0
    index = 0
    work_at_start = 0.0
    while index < len(schedule):
        gap = rng.expovariate(1.0) if process == "poisson" else rng.gammavariate(shape, 1.0 / shape)
        work += gap
        while index < len(schedule):
            segment = schedule[index]
            work_in_segment = segment.rate_rps * (segment.end_s - segment.start_s)
            if work < work_at_start + work_in_segment:
                offsets.append(segment.start_s + (work - work_at_start) / segment.rate_rps)
                break
            work_at_start += work_in_segment
            index += 1
    return offsets
