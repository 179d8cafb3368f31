"""How much traffic a replica that only just became ready may take: a slow start.

A replica ready for ``t < warmup_s`` seconds gets the Envoy slow-start weight
``max(min_ratio, (t / warmup_s) ** (1 / aggression))``; a replica whose time-to-first-token average
exceeds ``cold_ttft_factor`` x the mean of the other candidates' is treated as just ready (weight
``min_ratio``) whatever its age, because it is still compiling, loading or swapping. It must also
exceed that mean by ``COLD_TTFT_MIN_EXCESS_S``: a stall of that kind costs seconds, while replicas
answering in milliseconds differ by 3x from scheduling noise alone (a loaded host, a GC pause), and
taking such a replica out of decisions would move prefixes off their cache for nothing. The weight is
applied as the probability that the candidate stays in the decision, drawn from the injected seeded
``random.Random``, not as a factor on its score: a cold replica has no load, so it would top any
load-based score and a score factor would not stop it from taking most of a burst. As a keep
probability the weight is an upper bound on its share, whatever the others' load. Ramping never
empties a decision: if every candidate is dropped, all are kept.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from kvgate.vocabulary.replica import ReplicaView

COLD_TTFT_MIN_EXCESS_S = 0.25
"""How far above the others' mean TTFT a replica must be, as well as ``cold_ttft_factor`` x it, to
count as cold."""


def ramp_weight(ready_for_s: float, warmup_s: float, min_ratio: float, aggression: float) -> float:
    if warmup_s <= 0 or ready_for_s >= warmup_s:
        return 1.0
    if ready_for_s <= 0:
        return min_ratio
    ramped: float = (ready_for_s / warmup_s) ** (1.0 / aggression)
    return ramped if ramped > min_ratio else min_ratio


@dataclass(frozen=True, slots=True)
class Ramp:
    warmup_s: float
    min_ratio: float
    aggression: float
    cold_ttft_factor: float

    def _all_warm(self, views: Sequence[ReplicaView], now_s: float) -> bool:
        """Every view has weight 1: past its warm-up and not cold against the others' mean TTFT."""
        warmup_s = self.warmup_s
        ttft_sum_s = 0.0
        ttft_count = 0
        for view in views:
            ready_since_s = view.ready_since_s
            if warmup_s > 0 and (ready_since_s is None or now_s - ready_since_s < warmup_s):
                return False
            if view.ttft_ewma_s is not None:
                ttft_sum_s += view.ttft_ewma_s
                ttft_count += 1
        if ttft_count < 2:
            return True
        for view in views:
            ttft_s = view.ttft_ewma_s
            if ttft_s is not None and self._is_cold(ttft_s, (ttft_sum_s - ttft_s) / (ttft_count - 1)):
                return False
        return True

    def _is_cold(self, ttft_s: float, others_mean_s: float) -> bool:
        excess_s = ttft_s - others_mean_s
        return ttft_s > self.cold_ttft_factor * others_mean_s and excess_s > COLD_TTFT_MIN_EXCESS_S

    def weights(self, views: Sequence[ReplicaView], now_s: float) -> list[float]:
        ttft_sum_s = 0.0
        ttft_count = 0
        for view in views:
            if view.ttft_ewma_s is not None:
                ttft_sum_s += view.ttft_ewma_s
                ttft_count += 1
        warmup_s, min_ratio, aggression = self.warmup_s, self.min_ratio, self.aggression
        weights: list[float] = []
        for view in views:
            ready_since_s = view.ready_since_s
            ready_for_s = now_s - ready_since_s if ready_since_s is not None else 0.0
            weight = ramp_weight(ready_for_s, warmup_s, min_ratio, aggression)
            ttft_s = view.ttft_ewma_s
            if (
                ttft_s is not None
                and ttft_count > 1
                and self._is_cold(ttft_s, (ttft_sum_s - ttft_s) / (ttft_count - 1))
            ):
                weight = min_ratio
            weights.append(weight)
        return weights

    def keep(self, views: Sequence[ReplicaView], now_s: float, rng: random.Random) -> list[ReplicaView]:
        """The candidates that stay in this decision; a candidate of weight 1 costs no draw."""
        if self._all_warm(views, now_s):
            return list(views)
        kept = [
            view
            for view, weight in zip(views, self.weights(views, now_s), strict=True)
            if weight >= 1.0 or rng.random() < weight
        ]
        return kept if kept else list(views)
