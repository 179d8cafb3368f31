"""What both modes share: the fleet's floor, the request-rate scaler's utilisation target, and the
nearest-rank percentiles the figures are read with.
"""

from __future__ import annotations

import math

MIN_REPLICAS = 2
UTILIZATION_TARGET = 0.75
"""The request-rate scaler's target: this share of what one replica sustains at the baseline mix."""


def p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(0.95 * len(ordered))) - 1]


def pct(values: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of ``values``, which are sorted; NaN for none."""
    return values[max(1, math.ceil(q * len(values))) - 1] if values else math.nan
