"""``--mode model``: three scalers resize the fluid fleet on the same seeded trace; the figures."""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.autoscale.fluid_fleet import (
    BURST,
    INTERVAL_S,
    MAX_REPLICAS,
    PREFILL_TOKENS_PER_S,
    TICK_S,
    Fleet,
    baseline_capacity_rps,
    trace,
)
from bench.autoscale.scenario import MIN_REPLICAS, UTILIZATION_TARGET, pct
from kvgate.autoscaler.policy import Autoscaler
from kvgate.autoscaler.signals import PoolSignals
from kvgate.config.autoscaler import AutoscalerConfig, PoolPolicy


@dataclass(slots=True)
class Timeline:
    time_s: list[float] = field(default_factory=list)
    replicas: list[int] = field(default_factory=list)
    ready: list[int] = field(default_factory=list)
    ttft_p95_s: list[float] = field(default_factory=list)
    occupancy_ratio: list[float] = field(default_factory=list)
    prompt_tokens_per_s: list[float] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)


Scaler = Callable[[PoolSignals], int]


def work_scaler(cold_start_s: float, capacity_known: bool) -> tuple[Scaler, list[str]]:
    policy = PoolPolicy(
        min_replicas=MIN_REPLICAS,
        max_replicas=MAX_REPLICAS,
        cold_start_s=cold_start_s,
        prefill_capacity_tokens_per_s=PREFILL_TOKENS_PER_S if capacity_known else None,
        target_utilization_ratio=UTILIZATION_TARGET,
    )
    autoscaler = Autoscaler(AutoscalerConfig(interval_s=INTERVAL_S, policy=policy))
    reasons: list[str] = []

    def scale(s: PoolSignals) -> int:
        rec = autoscaler.update([s])[0]
        reasons.append(rec.reason)
        return rec.desired_replicas

    return scale, reasons


def request_rate_scaler(fleet: Fleet, target_per_replica: float) -> Scaler:
    history: deque[tuple[float, int]] = deque()

    def scale(s: PoolSignals) -> int:
        raw = math.ceil(fleet.requests_per_s() / target_per_replica)
        history.append((s.time_s, raw))
        while history[0][0] < s.time_s - 300.0:
            history.popleft()
        desired = raw if raw >= s.replicas_current else max(n for _, n in history)
        return max(MIN_REPLICAS, min(MAX_REPLICAS, desired))

    return scale


def simulate(name: str, end_s: float, cold_start_s: float, seed: int) -> tuple[Timeline, Fleet]:
    fleet = Fleet(MIN_REPLICAS, cold_start_s)
    reasons: list[str] = []
    if name in ("work", "conjunction"):
        scaler, reasons = work_scaler(cold_start_s, capacity_known=name == "work")
    else:
        scaler = request_rate_scaler(fleet, target_per_replica=baseline_capacity_rps() * UTILIZATION_TARGET)
    requests = deque(trace(seed, end_s))
    timeline = Timeline()
    ticks_per_interval = round(INTERVAL_S / TICK_S)
    for tick in range(round(end_s / TICK_S)):
        now_s = tick * TICK_S
        while requests and requests[0].arrival_s <= now_s:
            fleet.arrive(requests.popleft())
        fleet.step(now_s)
        if tick % ticks_per_interval == 0 and now_s > 0:
            s = fleet.signals(now_s)
            fleet.resize(scaler(s), now_s)
            timeline.time_s.append(now_s)
            timeline.replicas.append(s.replicas_current)
            timeline.ready.append(s.replicas_ready)
            timeline.ttft_p95_s.append(s.ttft_p95_s or 0.0)
            timeline.occupancy_ratio.append(s.kv_occupancy_ratio)
            timeline.prompt_tokens_per_s.append(s.prompt_tokens_per_s)
    timeline.reasons = reasons
    return timeline, fleet


def first_time(timeline: Timeline, predicate: Callable[[int], bool], after_s: float) -> float | None:
    for i, t in enumerate(timeline.time_s):
        if t >= after_s and predicate(i):
            return t
    return None


def flaps(timeline: Timeline, within_s: float = 600.0) -> int:
    """Reversals of direction (out then in, or in then out) less than ``within_s`` apart."""
    changes = [
        (t, b - a)
        for t, a, b in zip(timeline.time_s[1:], timeline.replicas, timeline.replicas[1:], strict=False)
        if b != a
    ]
    return sum(
        1 for (t0, d0), (t1, d1) in itertools.pairwise(changes) if (d0 > 0) != (d1 > 0) and t1 - t0 < within_s
    )


def summarize(name: str, timeline: Timeline, fleet: Fleet) -> None:
    start, end = BURST
    ttfts = sorted(
        r.first_token_s - r.arrival_s
        for r in fleet.finished
        if r.first_token_s and start <= r.arrival_s < end
    )
    baseline = timeline.replicas[int(start / INTERVAL_S) - 1]
    scaled = first_time(timeline, lambda i: timeline.replicas[i] > baseline, start)
    recovered = first_time(
        timeline, lambda i: timeline.ttft_p95_s[i] < 1.5 and timeline.time_s[i] > (scaled or math.inf), start
    )
    replica_s = sum(timeline.replicas) * INTERVAL_S
    print(f"== {name}")
    print(f"  first scale-out after burst start   {_secs(scaled, start)}")
    print(f"  TTFT p95 back under 1.5 s after     {_secs(recovered, start)}")
    print(f"  peak replicas                       {max(timeline.replicas):>8}")
    print(f"  replicas at end                     {timeline.replicas[-1]:>8}")
    print(f"  flaps (reversals within 600 s)      {flaps(timeline):>8}")
    print(f"  burst requests TTFT p50 / p95       {pct(ttfts, 0.5):>8.2f} s / {pct(ttfts, 0.95):.2f} s")
    print(f"  replica-hours                       {replica_s / 3600:>8.2f}")
    if timeline.reasons:
        counts: dict[str, int] = {}
        for reason in timeline.reasons:
            counts[reason] = counts.get(reason, 0) + 1
        print(
            "  decisions                           "
            + ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
        )


def _secs(t: float | None, start: float) -> str:
    return "   never" if t is None else f"{t - start:>8.0f} s"
