"""How long until a request would be admitted: the expected wait behind resident and queued work.

``WaitForecast.expected_wait_s`` turns the fleet's resident reservations (each finishing after its
pending prefill and its expected remaining decode, from the learned output lengths) and the work
queued ahead into the wait of ``retry_after.drain_wait_s``. Each replica drains at its own measured
pace where one is known: the inter-token latency its learned line (``kvgate.admission.itl_guard``)
predicts at the sequences it runs now, else the fleet's smoothed latency. A replica's drain state is
rebuilt only when its load, the measured rates or the learned lengths changed, so a burst of
refusals costs one pass over the resident work, not one per refusal.

``ForecastMargin`` keeps what the forecast has missed by: how much later than forecast queued
requests left the queue. A request whose wait is bounded by its TTFT objective is queued only when
its forecast plus that margin fits, so the queue does not admit what it will serve too late.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import deque
from collections.abc import Callable, Sequence

from kvgate.admission.calibration import Calibration
from kvgate.admission.ledger import Ledger
from kvgate.admission.placement import MaxActive
from kvgate.admission.queue import Ahead
from kvgate.admission.retry_after import (
    Backlog,
    FleetDrain,
    ReplicaDrain,
    ResidentWork,
    ServiceRates,
    completions_s,
    drain_wait_s,
)
from kvgate.vocabulary.capacity import kv_room_tokens
from kvgate.vocabulary.replica import ReplicaView

ReplicaItl = Callable[[ReplicaView], float | None]
"""A replica's measured inter-token latency at its present load (seconds), None when not known."""


def _unknown(view: ReplicaView) -> float | None:
    return None


class WaitForecast:
    def __init__(
        self,
        ledger: Ledger,
        calibration: Calibration,
        rates: ServiceRates,
        max_active: MaxActive,
        replica_itl: ReplicaItl = _unknown,
    ) -> None:
        self.ledger = ledger
        self.calibration = calibration
        self.rates = rates
        self._max_active = max_active
        self._replica_itl = replica_itl
        self._drains: dict[str, tuple[tuple[object, ...], ReplicaDrain]] = {}
        self._fleet_drain: FleetDrain | None = None

    def expected_wait_s(
        self, kv_tokens: int, model: str, ahead: Ahead, serving: Sequence[ReplicaView]
    ) -> float:
        expected_output = (
            ahead.requests
            * self.calibration.expected_remaining_tokens(
                model, 0, round(ahead.max_output_tokens / ahead.requests)
            )
            if ahead.requests > 0
            else 0.0
        )
        backlog = Backlog(ahead.requests, ahead.kv_tokens, ahead.prompt_tokens, expected_output)
        drains = tuple(self._drain(v) for v in serving)
        if self._fleet_drain is None or self._fleet_drain.replicas != drains:
            self._fleet_drain = FleetDrain.of(drains)
        return drain_wait_s(kv_tokens, self._fleet_drain, backlog, self.rates)

    def _drain(self, view: ReplicaView) -> ReplicaDrain:
        """The replica's drain state, cached until its load, the rates or the learned lengths change."""
        max_active = self._max_active(view)
        rates = self.rates
        itl_s = self._replica_itl(view)
        if itl_s is not None and itl_s > 0.0:
            rates = dataclasses.replace(rates, inter_token_s=itl_s)
        key = (view.load, view.kv_capacity_tokens, max_active, rates, self.calibration.version)
        cached = self._drains.get(view.replica_id)
        if cached is not None and cached[0] == key:
            return cached[1]
        resident = sorted(self.ledger.resident(view.replica_id), key=lambda held: held.reserved_at_s)
        work = [
            ResidentWork(
                held.kv_tokens,
                held.pending_prompt_tokens,
                self.calibration.expected_remaining_tokens(
                    held.cost.model, held.produced_tokens, held.cost.max_output_tokens
                ),
            )
            for held in resident
        ]
        drain = ReplicaDrain(
            view.replica_id,
            kv_room_tokens(view),
            view.kv_capacity_tokens,
            view.load.resident_sequences,
            max_active,
            completions_s(work, rates),
        )
        self._drains[view.replica_id] = (key, drain)
        return drain


MARGIN_QUANTILE = 0.95
MARGIN_WINDOW = 200
"""Queue departures the margin is read from: the most recent ones, so it follows the fleet's pace."""
MARGIN_MIN_OBSERVED = 20
"""Departures seen before the margin applies (none until then)."""


class ForecastMargin:
    """The ``MARGIN_QUANTILE`` of the last ``MARGIN_WINDOW`` queue-wait forecast errors (actual wait
    less the forecast, seconds), never below 0; each observation costs O(window)."""

    def __init__(
        self,
        quantile: float = MARGIN_QUANTILE,
        window: int = MARGIN_WINDOW,
        min_observed: int = MARGIN_MIN_OBSERVED,
    ) -> None:
        self.quantile = quantile
        self.min_observed = min_observed
        self._recent: deque[float] = deque(maxlen=window)
        self._sorted: list[float] = []
        self.margin_s = 0.0

    def observe(self, error_s: float) -> None:
        if len(self._recent) == self._recent.maxlen:
            del self._sorted[bisect.bisect_left(self._sorted, self._recent[0])]
        self._recent.append(error_s)
        bisect.insort(self._sorted, error_s)
        count = len(self._sorted)
        if count >= self.min_observed:
            self.margin_s = max(0.0, self._sorted[int(self.quantile * (count - 1))])
