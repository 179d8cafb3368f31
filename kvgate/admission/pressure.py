"""Whether a Retry-After can be kept without refusing someone else: the fleet's spare capacity.

A promise is kept by letting the returning request go ahead of new arrivals. While new requests
alone arrive faster than the fleet admits work, every promise kept is a newcomer refused, and when
the model has a time-to-first-token objective that trade loses twice: the newcomer could have met
the objective, the retry (whose user has been waiting since its first attempt) cannot. So for
requests with a TTFT objective, a promise is booked only against the capacity new arrivals are not
expected to take: the drain-time estimate is stretched by ``1 / (1 - pressure)``, where pressure is
new work arriving over the work the fleet admits while saturated, both in KV tokens over the last
``window_s``. At a pressure of 1 or more no time is honest, so the refusal says not to retry
(``x-should-retry: false``) and books nothing; as arrivals fall back below capacity, promises
return, at the times the spare capacity can serve them.

Both rates are measured, never configured. The fleet's capacity is what it admitted in the seconds
it turned work away (a refusal for room, or a queued request whose wait ran out), so a fleet that
took everything in the window, at once or after a wait, has no measured capacity and no pressure:
every estimate stands as it is.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

WINDOW_S = 30
"""Seconds of arrivals and admissions behind the pressure: long enough that a second's lull in a
burst does not reopen promises, short enough that they return within a window of the burst's end."""


@dataclass(slots=True)
class _Second:
    at_s: int
    arrived_kv: int = 0
    admitted_kv: int = 0
    saturated: bool = False


class ArrivalPressure:
    """New work arriving against the work the fleet admits while saturated, over a sliding window
    of whole seconds; each call is amortised O(1)."""

    def __init__(self, window_s: int = WINDOW_S) -> None:
        self.window_s = window_s
        self._seconds: deque[_Second] = deque()

    def arrived(self, kv_tokens: int, now_s: float) -> None:
        """A request asked for the first time (not a promised one coming back)."""
        self._second(now_s).arrived_kv += kv_tokens

    def admitted(self, kv_tokens: int, now_s: float) -> None:
        """The fleet took a request's worst case: at once, from the queue, or on a kept promise."""
        self._second(now_s).admitted_kv += kv_tokens

    def saturated(self, now_s: float) -> None:
        """The fleet turned work away: what it admits this second is all it can take."""
        self._second(now_s).saturated = True

    def ratio(self, now_s: float) -> float | None:
        """New work over capacity in the window; None when the fleet was never saturated in it."""
        self._trim(now_s)
        saturated = [s for s in self._seconds if s.saturated]
        if not saturated:
            return None
        capacity_kv_per_s = sum(s.admitted_kv for s in saturated) / len(saturated)
        if capacity_kv_per_s <= 0:
            return math.inf
        # Over the seconds the window has seen, so a gateway's first burst is not diluted by the
        # seconds before it started.
        span_s = math.floor(now_s) - self._seconds[0].at_s + 1
        arrived_kv_per_s = sum(s.arrived_kv for s in self._seconds) / span_s
        return arrived_kv_per_s / capacity_kv_per_s

    def stretch(self, expected_s: float, now_s: float) -> float:
        """The wait after which spare capacity, not a newcomer's share, serves a request the drain
        estimate says fits in ``expected_s``; ``inf`` when arrivals leave none."""
        pressure = self.ratio(now_s)
        if pressure is None or pressure <= 0:
            return expected_s
        if pressure >= 1:
            return math.inf
        return expected_s / (1.0 - pressure)

    def _second(self, now_s: float) -> _Second:
        at_s = math.floor(now_s)
        seconds = self._seconds
        if not seconds or seconds[-1].at_s != at_s:
            self._trim(now_s)
            seconds.append(_Second(at_s))
        return seconds[-1]

    def _trim(self, now_s: float) -> None:
        oldest_s = math.floor(now_s) - self.window_s
        seconds = self._seconds
        while seconds and seconds[0].at_s <= oldest_s:
            seconds.popleft()
