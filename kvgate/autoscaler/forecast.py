"""Foresight for one pool: the demand expected over the next cold start, from the pool's own history,
and the fewest replicas an operator's schedule asks for; both an input to the policy, never an answer.

Demand is in replicas (what the present signals would size the pool to at their targets). The
forecaster keeps a seasonal profile of it, one slot per ``bucket_s`` of the day (``season_s``) and of
the week (seven seasons, preferred for a slot once a week of it was seen), each slot the mean of
its samples in a season, smoothed across seasons by ``smoothing_ratio``. The forecast at ``t`` is
the most the profile holds over ``[t, t + lead]``, moved by how far the present is below the profile
now: the short-term level (the least-squares line of the last ``trend_window_s`` of demand, at
``t``) minus the profile's mean over that same trailing window, measured the same way (a profile
learned from 60 s rates lags a step as today's rates do). A present above the profile adds nothing
(the present signals already ask for it); one below takes the difference off, so a rise that the
history holds and today does not show costs one lead and is dropped. With no history for the
slots ahead there is no forecast. Its error is measured online: each forecast against the most
demand that arrived over its lead, once the lead has passed. Pure: time comes from the samples,
read as Unix seconds for the time of day and week (UTC).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from kvgate.autoscaler.trend import trend_at
from kvgate.config.autoscaler import ForecastPolicy, weekdays

WEEK_SEASONS = 7
DAY_S = 86400.0
ERROR_SAMPLES = 20
"""The mean absolute error averages about this many settled forecasts."""
EPOCH_WEEKDAY = 3
"""1970-01-01 was a Thursday (Monday is 0)."""


@dataclass(frozen=True, slots=True)
class Foresight:
    """What foresight asks of a pool at one instant."""

    replicas: int
    """Fewest replicas the forecast and the schedule ask for (0: nothing)."""
    reason: str
    """``forecast`` or ``schedule``: the larger of the two."""
    forecast_replicas: float | None
    """Demand forecast over the lead, in replicas; None without history for it."""
    forecast_error_replicas: float | None
    """The latest forecast whose lead has passed, minus the most demand over that lead."""


class _Slot(NamedTuple):
    before: float | None
    """The slot smoothed over the seasons before ``season``."""
    latest: float
    season: int


class Forecaster:
    """Seasonal profile plus short-term level of one pool's demand; feed samples in time order."""

    def __init__(self, policy: ForecastPolicy, lead_s: float) -> None:
        self.policy = policy
        self.lead_s = lead_s
        self._slots_per_season = max(1, round(policy.season_s / policy.bucket_s))
        self._week_slots = self._slots_per_season * WEEK_SEASONS
        self._day: dict[int, _Slot] = {}
        self._week: dict[int, _Slot] = {}
        self._open_bucket: int | None = None
        self._open_sum = 0.0
        self._open_n = 0
        self._recent: deque[tuple[float, float]] = deque()
        """(time, demand) over the last ``trend_window_s``."""
        self._pending: deque[tuple[float, float]] = deque()
        """(time made, forecast) waiting for their lead to pass."""
        self._seen: deque[tuple[float, float]] = deque()
        """(time, demand) over the last lead, to judge the forecasts made a lead ago."""
        self.last_error_replicas: float | None = None
        self.errors = 0
        self.mean_abs_error_replicas = 0.0

    def observe(self, time_s: float, demand_replicas: float) -> float | None:
        """Record one sample; the forecast error it settles, if any."""
        p = self.policy
        bucket = math.floor(time_s / p.bucket_s)
        if self._open_bucket is not None and bucket != self._open_bucket:
            self._fold()
        if self._open_bucket != bucket:
            self._open_bucket, self._open_sum, self._open_n = bucket, 0.0, 0
        self._open_sum += demand_replicas
        self._open_n += 1
        self._recent.append((time_s, demand_replicas))
        while self._recent[0][0] < time_s - p.trend_window_s:
            self._recent.popleft()
        self._seen.append((time_s, demand_replicas))
        while self._seen[0][0] < time_s - self.lead_s:
            self._seen.popleft()
        settled = None
        while self._pending and self._pending[0][0] + self.lead_s <= time_s:
            made_s, forecast = self._pending.popleft()
            arrived = max((d for t, d in self._seen if t > made_s), default=demand_replicas)
            settled = forecast - arrived
        if settled is not None:
            self.last_error_replicas = settled
            self.errors += 1
            weight = 1 / min(self.errors, ERROR_SAMPLES)
            self.mean_abs_error_replicas += weight * (abs(settled) - self.mean_abs_error_replicas)
        return settled

    def _fold(self) -> None:
        """Close the bucket that just ended into its slot of the day and of the week."""
        assert self._open_bucket is not None and self._open_n > 0
        value = self._open_sum / self._open_n
        for slots, length in ((self._day, self._slots_per_season), (self._week, self._week_slots)):
            key, season = self._open_bucket % length, self._open_bucket // length
            slot = slots.get(key)
            if slot is None:
                slots[key] = _Slot(None, value, season)
            elif slot.season == season:
                slots[key] = _Slot(slot.before, value, season)
            else:
                slots[key] = _Slot(self._blend(slot.before, slot.latest), value, season)

    def _blend(self, before: float | None, latest: float) -> float:
        alpha = self.policy.smoothing_ratio
        return latest if before is None else (1 - alpha) * before + alpha * latest

    def profile(self, time_s: float) -> float | None:
        """The profile's demand at ``time_s`` from the seasons before ``time_s``'s own: the week's
        slot where a week of it was seen, else the day's."""
        bucket = math.floor(time_s / self.policy.bucket_s)
        for slots, length in ((self._week, self._week_slots), (self._day, self._slots_per_season)):
            slot = slots.get(bucket % length)
            if slot is None:
                continue
            value = slot.before if slot.season == bucket // length else self._blend(slot.before, slot.latest)
            if value is not None:
                return value
        return None

    def forecast(self, time_s: float) -> float | None:
        """Demand expected over ``[time_s, time_s + lead]``, in replicas; None without history."""
        if not self._recent or self._open_bucket is None:
            return None
        p = self.policy
        current = math.floor(time_s / p.bucket_s)
        ahead = [
            self.profile((b + 0.5) * p.bucket_s)
            for b in range(current, math.floor((time_s + self.lead_s) / p.bucket_s) + 1)
        ]
        known = [v for v in ahead if v is not None]
        if not known:
            return None
        trailing = [
            v
            for b in range(math.floor((time_s - p.trend_window_s) / p.bucket_s), current + 1)
            if (v := self.profile((b + 0.5) * p.bucket_s)) is not None
        ]
        recent = list(self._recent)
        level = trend_at(recent, time_s) if len(recent) >= 3 else recent[-1][1]
        below = min(0.0, level - sum(trailing) / len(trailing)) if trailing else 0.0
        value = max(0.0, max(known) + below)
        self._pending.append((time_s, value))
        return value


def scheduled_replicas(policy: ForecastPolicy, time_s: float, lead_s: float) -> int:
    """The most ``min_replicas`` of the schedule's windows that overlap ``[time_s, time_s + lead]``
    (Unix seconds, UTC); 0 when none does."""
    best = 0
    today = math.floor(time_s / DAY_S)
    for window in policy.schedule:
        days = weekdays(window.days)
        start_s, end_s = _seconds(window.start), _seconds(window.end)
        length_s = end_s - start_s if end_s > start_s else end_s + DAY_S - start_s
        for day in (today - 1, today, today + 1):
            if (day + EPOCH_WEEKDAY) % 7 not in days:
                continue
            opens_s = day * DAY_S + start_s
            if opens_s <= time_s + lead_s and opens_s + length_s > time_s:
                best = max(best, window.min_replicas)
    return best


def _seconds(clock: str) -> float:
    hours, minutes = clock.split(":")
    return int(hours) * 3600.0 + int(minutes) * 60.0
