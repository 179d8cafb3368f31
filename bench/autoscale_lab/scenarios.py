"""The autoscaling lab's scenarios: seeded open-loop traces whose demand moves in the ways that
separate scaling signals.

Four request classes, sized for the lab's replica (Llama-3.1-8B on an H100, cut to 50,000 KV tokens
and 16 sequences as in the routing lab, so a handful of replicas carries a scenario and a run stays
seconds): short chats, long documents (prefill-heavy, KV-heavy), long generations (decode-heavy), and
turns of long-context sessions whose prompt grows turn by turn and shares its prefix with the
session's earlier turns. A scenario is a request rate and a class mix, both functions of time; the
trace draws arrivals from them by thinning a Poisson process, so one seed always gives the same
requests. Each scenario also names the instant its demand starts to rise and the instant it starts
to fall, the reference for time-to-scale-out and time-to-scale-in. Token ids are ranges (a prompt's
ids are ``range(prefix_id * PREFIX_SPAN, ... + prompt_tokens)``), so prompts cost no memory, a
session's turns share their prefix, and every other prompt is unique.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

_T = TypeVar("_T")

PREFIX_SPAN = 1_000_000
"""Token ids per prefix id: longer than any prompt, so two prefixes never share a block."""


@dataclass(frozen=True, slots=True)
class Arrival:
    index: int
    class_name: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefix_id: int
    """Requests with the same prefix id share their first ``min(prompt_tokens)`` tokens."""

    @property
    def token_ids(self) -> range:
        start = self.prefix_id * PREFIX_SPAN
        return range(start, start + self.prompt_tokens)


Mix = Mapping[str, float]
"""Class name to weight (weights need not sum to one)."""


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    duration_s: float
    rate_rps: Callable[[float], float]
    """Requests (or session turns) per second offered at a virtual instant."""
    mix: Callable[[float], Mix]
    peak_rate_rps: float
    """An upper bound of ``rate_rps``, for thinning."""
    rise_s: float
    """When demand starts to rise above what the fleet had."""
    fall_s: float
    """When demand starts to fall."""
    description: str
    day_s: float | None = None
    """The length of one day of a scenario that repeats daily (None: it does not repeat)."""
    history_s: float = 0.0
    """Measured from here on: what comes before is history (a week's first day)."""

    def arrivals(self, seed: int) -> list[Arrival]:
        rng = random.Random(f"{self.name}:{seed}")
        out: list[Arrival] = []
        sessions: list[_Session] = []
        next_prefix = 1
        now_s = 0.0
        while True:
            now_s += rng.expovariate(self.peak_rate_rps)
            if now_s >= self.duration_s:
                break
            if rng.random() * self.peak_rate_rps > self.rate_rps(now_s):
                continue
            name = _pick(rng, self.mix(now_s))
            if name == "session":
                session = _Session(next_prefix, rng.randint(14_000, 20_000), rng.randint(6, 12))
                next_prefix += 1
                sessions.append(session)
                turn_s = now_s
                for _ in range(session.turns):
                    out.append(session.turn(len(out), turn_s, rng))
                    turn_s += rng.uniform(10.0, 30.0)
                continue
            prompt, output = CLASSES[name](rng)
            out.append(Arrival(len(out), name, now_s, prompt, output, next_prefix))
            next_prefix += 1
        out.sort(key=lambda a: (a.arrival_s, a.index))
        return [
            Arrival(i, a.class_name, a.arrival_s, a.prompt_tokens, a.output_tokens, a.prefix_id)
            for i, a in enumerate(out)
        ]


@dataclass(slots=True)
class _Session:
    prefix_id: int
    context_tokens: int
    turns: int

    def turn(self, index: int, at_s: float, rng: random.Random) -> Arrival:
        output = rng.randint(300, 800)
        arrival = Arrival(index, "session", at_s, self.context_tokens, output, self.prefix_id)
        self.context_tokens += output + rng.randint(100, 600)
        return arrival


def _lognormal(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    return max(low, min(high, round(rng.lognormvariate(math.log(median), sigma))))


CLASSES: Mapping[str, Callable[[random.Random], tuple[int, int]]] = {
    "chat": lambda rng: (_lognormal(rng, 300, 0.6, 30, 2000), _lognormal(rng, 150, 0.5, 20, 500)),
    "document": lambda rng: (rng.randint(6000, 12000), _lognormal(rng, 200, 0.3, 50, 400)),
    "generation": lambda rng: (_lognormal(rng, 200, 0.5, 20, 800), rng.randint(800, 1600)),
}
"""(prompt tokens, output tokens) per class; ``session`` turns are drawn by ``_Session``."""


def _pick(rng: random.Random, mix: Mix) -> str:
    total = sum(mix.values())
    x = rng.random() * total
    for name, weight in mix.items():
        x -= weight
        if x < 0:
            return name
    return next(iter(mix))


BASE_MIX: Mix = {"chat": 0.7, "document": 0.15, "generation": 0.15}


def _ramp(low: float, high: float, rise_s: float, peak_s: float, end_s: float) -> Callable[[float], float]:
    """Flat at ``low`` until ``rise_s``, a half cosine up to ``high`` at ``peak_s`` and down to ``low``
    at ``end_s``, flat after."""

    def rate(t: float) -> float:
        if t <= rise_s or t >= end_s:
            return low
        phase = (t - rise_s) / (end_s - rise_s)
        return low + (high - low) * 0.5 * (1 - math.cos(2 * math.pi * phase))

    return rate


def _steps(*steps: tuple[float, _T]) -> Callable[[float], _T]:
    """Piecewise constant: ``(from_s, value)`` pairs in time order (a rate, or a mix)."""

    def value(t: float) -> _T:
        current = steps[0][1]
        for at_s, v in steps:
            if t >= at_s:
                current = v
        return current

    return value


def _leak(start_s: float, stop_s: float) -> tuple[Callable[[float], float], Callable[[float], Mix]]:
    """Chats falling from 12 to 4 req/s from ``start_s`` to ``stop_s`` while long-context sessions
    start at a rate growing from none to 0.2/s (each about nine turns), stopping at ``stop_s``."""

    def progress(t: float) -> float:
        return 0.0 if t < start_s else min(1.0, (t - start_s) / (stop_s - start_s))

    def sessions(t: float) -> float:
        return 0.0 if t >= stop_s else 0.2 * progress(t)

    def chats(t: float) -> float:
        return 12.0 - 8.0 * progress(t)

    return (lambda t: chats(t) + sessions(t)), (lambda t: {"chat": chats(t), "session": sessions(t)})


LAB_DAY_S = 600.0
"""One day of the scenarios that repeat: ten minutes, so a week of them runs in minutes of wall time
(the forecast's season is configuration; its arithmetic does not depend on the day's length)."""
WEEK_DAYS = 7
_CHATS: Mix = {"chat": 1.0}


def _daily(value: Callable[[float], _T], day_s: float = LAB_DAY_S) -> Callable[[float], _T]:
    return lambda t: value(t % day_s)


def _burst_day(start_s: float) -> Callable[[float], float]:
    """The burst's day: 4 req/s, 16 for 3 minutes from ``start_s``."""
    return _steps((0.0, 4.0), (start_s, 16.0), (start_s + 180.0, 4.0))


def _moved(t: float) -> float:
    """The burst at 2:00 of the first three days, at 6:00 from the fourth on."""
    return _burst_day(120.0 if t < 3 * LAB_DAY_S else 360.0)(t % LAB_DAY_S)


SCENARIOS: Mapping[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "ramp",
            1800.0,
            _ramp(2.4, 18.0, 180.0, 900.0, 1620.0),
            lambda t: BASE_MIX,
            18.0,
            rise_s=180.0,
            fall_s=900.0,
            description="diurnal ramp of the base mix: 2.4 -> 18 -> 2.4 req/s (half cosines), 30 min",
        ),
        Scenario(
            "burst",
            1500.0,
            _steps((0.0, 4.0), (360.0, 16.0), (660.0, 4.0)),
            lambda t: BASE_MIX,
            16.0,
            rise_s=360.0,
            fall_s=660.0,
            description="4x burst of the base mix: 4 req/s, 16 for 5 min from 6:00, back to 4; 25 min",
        ),
        Scenario(
            "mix_shift",
            1680.0,
            lambda t: 7.5,
            _steps(
                (0.0, {"chat": 1.0}),
                (360.0, {"document": 1.0}),
                (780.0, {"generation": 1.0}),
                (1200.0, {"chat": 1.0}),
            ),
            7.5,
            rise_s=360.0,
            fall_s=1200.0,
            description="7.5 req/s throughout: chats, documents from 6:00, generations from 13:00, "
            "chats from 20:00; 28 min",
        ),
        Scenario(
            "leak",
            1800.0,
            *_leak(240.0, 1200.0),
            12.2,
            rise_s=240.0,
            fall_s=1200.0,
            description="chats fall from 12 to 4 req/s while long-context sessions (14-20k token "
            "prompts, 6-12 turns of 300-800 tokens) start at up to 0.2/s, from 4:00 to 20:00; 30 min",
        ),
        Scenario(
            "burst_week",
            WEEK_DAYS * LAB_DAY_S,
            _daily(_burst_day(120.0)),
            lambda t: BASE_MIX,
            16.0,
            rise_s=LAB_DAY_S + 120.0,
            fall_s=LAB_DAY_S + 300.0,
            description="the burst every day of a week of 10-minute days: the base mix at 4 req/s, 16 for "
            "3 min from 2:00; the first day is history",
            day_s=LAB_DAY_S,
            history_s=LAB_DAY_S,
        ),
        Scenario(
            "mix_shift_week",
            WEEK_DAYS * LAB_DAY_S,
            lambda t: 7.5,
            _daily(
                _steps(
                    (0.0, _CHATS),
                    (120.0, {"document": 1.0}),
                    (300.0, {"generation": 1.0}),
                    (480.0, _CHATS),
                )
            ),
            7.5,
            rise_s=LAB_DAY_S + 120.0,
            fall_s=LAB_DAY_S + 480.0,
            description="the mix shift every day of a week of 10-minute days: 7.5 req/s, documents from "
            "2:00, generations from 5:00, chats from 8:00; the first day is history",
            day_s=LAB_DAY_S,
            history_s=LAB_DAY_S,
        ),
        Scenario(
            "burst_moved",
            WEEK_DAYS * LAB_DAY_S,
            _moved,
            lambda t: BASE_MIX,
            16.0,
            rise_s=LAB_DAY_S + 120.0,
            fall_s=LAB_DAY_S + 300.0,
            description="the pattern breaks: the week's burst comes at 2:00 for three days, at 6:00 from "
            "the fourth; the first day is history",
            day_s=LAB_DAY_S,
            history_s=LAB_DAY_S,
        ),
        Scenario(
            "small",
            270.0,
            _steps((0.0, 1.0), (120.0, 4.0), (210.0, 1.0)),
            lambda t: {"chat": 0.6, "document": 0.2, "generation": 0.2},
            4.0,
            rise_s=120.0,
            fall_s=210.0,
            description="a short 4x burst for the tests: 1 -> 4 -> 1 req/s; 4.5 min",
        ),
    )
}
FULL = ("ramp", "burst", "mix_shift", "leak")
"""The single-day scenarios (``small`` is the tests')."""
WEEKS = ("burst_week", "mix_shift_week", "burst_moved")
"""The scenarios that repeat daily over a week, and the one whose pattern breaks."""
