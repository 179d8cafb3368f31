"""Least-squares trend and noise of a window of ``(time, value)`` points, for the scale-in sizing."""

from __future__ import annotations

import math


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of ``(time, value)`` points: every sample of the window weighs in, so one
    noisy sample at either end does not read as growth."""
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / spread if spread > 0 else 0.0


def trend_at(points: list[tuple[float, float]], time_s: float) -> float:
    """The value of the least-squares line of ``(time, value)`` points at ``time_s``."""
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    return mean_v + slope(points) * (time_s - mean_t)


def residual(points: list[tuple[float, float]]) -> float:
    """Standard deviation of ``(time, value)`` points around their least-squares line: the noise
    of a series without its trend (a ramp's steady fall is not noise); inf under three points, too
    few to tell noise from trend."""
    n = len(points)
    if n < 3:
        return math.inf
    gradient = slope(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    return math.sqrt(sum((v - mean_v - gradient * (t - mean_t)) ** 2 for t, v in points) / (n - 2))
