"""Whether a failed attempt may be retried on another replica.

A retry is allowed only before the first byte reached the client (the edge knows, and says so),
only while the request has retries left (``max_retries``), and only within a budget shared by all
requests: retries in the sliding window must stay below ``ratio x requests + floor``, so a failing
fleet sees at most a fraction more traffic instead of a retry storm, while a quiet gateway can
still retry a few. The window is two deques of timestamps pruned on each call (amortised O(1));
time is passed in, never read. Which replica a retry goes to is the router's job:
``Router.choose(..., exclude=replicas_tried)``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from kvgate.config.routing import RoutingConfig


@dataclass(frozen=True, slots=True)
class RetryVerdict:
    allowed: bool
    reason: str
    """``retry`` when allowed, else ``first_byte_sent``, ``max_retries`` or ``retry_budget``."""


class RetryBudget:
    def __init__(self, ratio: float, floor: int, window_s: float, max_retries: int) -> None:
        self._ratio = ratio
        self._floor = floor
        self._window_s = window_s
        self._max_retries = max_retries
        self._requests_s: deque[float] = deque()
        self._retries_s: deque[float] = deque()

    @classmethod
    def from_config(cls, config: RoutingConfig) -> RetryBudget:
        return cls(
            config.retry_budget_ratio,
            config.retry_budget_floor,
            config.retry_budget_window_s,
            config.max_retries,
        )

    def record_request(self, now_s: float) -> None:
        """Count one first attempt (not a retry) towards the budget. Stamps that left the window go
        here too, so a gateway that never retries keeps one window of them, not every request's."""
        stamps = self._requests_s
        stamps.append(now_s)
        oldest_s = now_s - self._window_s
        while stamps and stamps[0] <= oldest_s:
            stamps.popleft()

    def allow(self, now_s: float, retries_so_far: int, first_byte_sent: bool) -> RetryVerdict:
        """Whether this request may retry now; an allowed retry is spent from the budget."""
        if first_byte_sent:
            return RetryVerdict(False, "first_byte_sent")
        if retries_so_far >= self._max_retries:
            return RetryVerdict(False, "max_retries")
        self._prune(now_s)
        if len(self._retries_s) >= self._ratio * len(self._requests_s) + self._floor:
            return RetryVerdict(False, "retry_budget")
        self._retries_s.append(now_s)
        return RetryVerdict(True, "retry")

    def window_counts(self, now_s: float) -> tuple[int, int]:
        """Requests and retries in the window ending at ``now_s``."""
        self._prune(now_s)
        return len(self._requests_s), len(self._retries_s)

    def _prune(self, now_s: float) -> None:
        oldest_s = now_s - self._window_s
        for stamps in (self._requests_s, self._retries_s):
            while stamps and stamps[0] <= oldest_s:
                stamps.popleft()
