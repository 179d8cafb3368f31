"""The scalers the lab compares: kvgate's policy and the signals operators use today.

Each is a ``Scaler``: an observation in, desired replicas out. ``kvgate`` is ``kvgate.autoscaler.policy``
itself, unchanged. The baselines are what an HPA v2 (or KEDA, which drives an HPA) computes from one
metric: ``desired = ceil(ready x metric_per_replica / target)``, left alone while the ratio is within
the HPA's 10 % tolerance, then HPA v2's default ``behavior``: scale-up at once, at most to
``max(2 x current, current + 4)`` per evaluation, scale-down to the highest recommendation of the
last 300 s (the stabilisation window). Their targets are set the way an operator would set them,
from a load test of one replica (``calibrate``): 75 % of what one replica sustains within the SLO.
The oracle's follower replays a schedule computed offline (``bench.autoscale_lab.oracle``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence

from bench.autoscale_lab.loop import POOL
from bench.autoscale_lab.records import Observation, Scaler
from kvgate.autoscaler.policy import PoolAutoscaler
from kvgate.config.autoscaler import PoolPolicy

HPA_TOLERANCE_RATIO = 0.1
SCALE_DOWN_STABILIZATION_S = 300.0


class Hpa:
    """HPA v2 on one per-replica metric, with its default scaling behaviour."""

    def __init__(self, metric: Callable[[Observation], float], target: float) -> None:
        self._metric = metric
        self._target = target
        self._history: deque[tuple[float, int]] = deque()

    def __call__(self, o: Observation) -> int:
        s = o.signals
        current = s.replicas_current
        ready = max(1, s.replicas_ready)
        ratio = self._metric(o) / ready / self._target
        raw = current if abs(ratio - 1.0) <= HPA_TOLERANCE_RATIO else math.ceil(ready * ratio - 1e-9)
        now_s = s.time_s
        self._history.append((now_s, raw))
        while self._history[0][0] < now_s - SCALE_DOWN_STABILIZATION_S:
            self._history.popleft()
        if raw > current:
            return min(raw, max(2 * current, current + 4))
        return min(current, max(n for _, n in self._history))


def request_rate(target_rps_per_replica: float) -> Scaler:
    """KEDA's Prometheus scaler on ingress requests/s (``sum(rate(requests_total[1m]))``)."""
    return Hpa(lambda o: o.requests_per_s, target_rps_per_replica)


def utilization(target_ratio: float) -> Scaler:
    """HPA on a utilisation percentage: the engines' busy fraction (what GPU utilisation reports)."""
    return Hpa(lambda o: o.busy_ratio * max(1, o.signals.replicas_ready), target_ratio)


def waiting(target_per_replica: float) -> Scaler:
    """KEDA on vLLM's ``num_requests_waiting``, summed over the fleet."""
    return Hpa(lambda o: float(o.requests_waiting), target_per_replica)


class Kvgate:
    """``kvgate.autoscaler.policy.PoolAutoscaler``, keeping each decision's reason for the report."""

    def __init__(self, policy: PoolPolicy) -> None:
        self._policy = PoolAutoscaler(POOL, policy)
        self.reasons: list[str] = []

    def __call__(self, o: Observation) -> int:
        recommendation = self._policy.update(o.signals)
        self.reasons.append(recommendation.reason)
        return recommendation.desired_replicas


def follow(schedule: Sequence[int], step_s: float, lead_s: float) -> Scaler:
    """The oracle's actuator: at each instant, the most replicas the schedule needs from now until
    ``lead_s`` ahead (a replica asked for now serves one cold start later; one removed now is gone)."""

    def scale(o: Observation) -> int:
        first = int(o.signals.time_s // step_s)
        last = int((o.signals.time_s + lead_s) // step_s)
        window = schedule[first : last + 1]
        return max(window) if window else schedule[-1]

    return scale
