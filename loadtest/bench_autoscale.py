"""Closed-loop autoscaling benchmark: a burst of heavier requests against two scaling signals.

``--mode real`` (default) closes the loop with real parts, time-scaled to a few minutes: a
``kvgate sim`` process (``llama-3.1-70b-4xh100`` profile, two replicas, a control port), a
``kvgate serve`` process in front of it whose config carries the autoscaler section (so the gateway
runs the policy on its own ``/signals`` and publishes ``desired_replicas``), the load generator
(``loadtest.runner``: the normal mix all along plus, for the burst, as many requests again with
16x longer prompts), and the loop of ``kvgate autoscale --actuator sim`` acting on the answer:
``SimActuator`` adds replicas through the simulator's control API (each cold-starts) and sets the
gateway's replica set through ``PUT /admin/pools/default/replicas``. Every policy duration (windows,
interval, stabilisation, cold start, ramp) is the seed's divided by ``SCALE_RATIO``; latency targets
are not scaled. A second run replaces the gateway's answer with an HPA-style scaler on ingress
requests/s, its target 0.75 x what one replica sustains at the normal mix. Prints the figures and
writes both runs on one PNG.

``--mode model`` runs a token-level fluid model of the fleet on a manual clock instead (0.1 s
ticks, unscaled 120 s cold start, a 20-minute burst): kvgate's admission queue in front, routing to
the replica with the most KV room, reservations of ``prompt + max_output`` tokens against each
replica's KV capacity, chunked prefill at a fixed token rate, and decode whose inter-token latency
grows with the batch. Three scalers see the same seeded trace: ``work`` (the policy with the
model's prefill capacity), ``conjunction`` (the policy without capacity figures, the shipped
default) and ``requests`` (HPA-style on requests/s over 60 s against the baseline-mix target).
Not a test: numbers only.

    .venv/bin/python -m loadtest.bench_autoscale [--mode real|model] [--out autoscale.png]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import collections
import itertools
import json
import math
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from autoscaler.policy import Autoscaler, Recommendation
from autoscaler.signals import PoolSignals
from config.autoscaler import AutoscalerConfig, PoolPolicy
from gateway.autoscale_actuators import SimActuator
from gateway.autoscale_loop import fetch_signals
from loadtest.client import RequestRecord, wait_until_ok
from loadtest.runner import RunOptions, Target
from loadtest.runner import run as runner_run
from loadtest.workload import Workload, build_trace, parse_workload
from vocabulary.replica import Role

TICK_S = 0.1
INTERVAL_S = 15.0
WINDOW_S = 60.0
KV_CAPACITY_TOKENS = 120_000
MAX_SEQUENCES = 96
PREFILL_TOKENS_PER_S = 8_000.0
ITL_BASE_S = 0.012
ITL_PER_SEQUENCE_S = 0.0003
WARMUP_S = 60.0
WARMUP_FLOOR_RATIO = 0.3
MIN_REPLICAS = 2
UTILIZATION_TARGET = 0.75
MAX_REPLICAS = 16


@dataclass(frozen=True, slots=True)
class Phase:
    until_s: float
    requests_per_s: float
    prompt_tokens: int
    output_tokens: int


SCHEDULE = (
    Phase(900.0, 3.0, 500, 250),
    Phase(2100.0, 6.0, 4000, 250),
    Phase(7800.0, 3.0, 500, 250),
)
BURST = (900.0, 2100.0)


@dataclass(slots=True)
class Request:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    max_output_tokens: int
    admitted_s: float | None = None
    prefilled_tokens: float = 0.0
    first_token_s: float | None = None
    produced_tokens: float = 0.0

    @property
    def kv_tokens(self) -> int:
        return self.prompt_tokens + self.max_output_tokens


@dataclass(slots=True)
class Replica:
    ready_at_s: float
    draining: bool = False
    prefilling: deque[Request] = field(default_factory=deque)
    decoding: list[Request] = field(default_factory=list)
    reserved_kv_tokens: int = 0

    def ready(self, now_s: float) -> bool:
        return now_s >= self.ready_at_s

    def speed_ratio(self, now_s: float) -> float:
        warm = min(1.0, (now_s - self.ready_at_s) / WARMUP_S)
        return WARMUP_FLOOR_RATIO + (1 - WARMUP_FLOOR_RATIO) * warm

    @property
    def sequences(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    def fits(self, request: Request) -> bool:
        return (
            self.reserved_kv_tokens + request.kv_tokens <= KV_CAPACITY_TOKENS
            and self.sequences < MAX_SEQUENCES
        )


def trace(seed: int, end_s: float) -> list[Request]:
    rng = random.Random(seed)
    requests, t = [], 0.0
    for phase in SCHEDULE:
        while t < min(phase.until_s, end_s):
            t += rng.expovariate(phase.requests_per_s)
            prompt = max(16, int(rng.lognormvariate(math.log(phase.prompt_tokens), 0.4)))
            output = max(1, int(rng.lognormvariate(math.log(phase.output_tokens), 0.5)))
            requests.append(Request(t, prompt, min(output, 1024), 1024))
    return requests


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


class Fleet:
    def __init__(self, replicas: int, cold_start_s: float) -> None:
        self.cold_start_s = cold_start_s
        self.replicas = [Replica(ready_at_s=0.0) for _ in range(replicas)]
        self.queue: deque[Request] = deque()
        self.ttfts: deque[tuple[float, float]] = deque()
        self.queue_waits: deque[tuple[float, float]] = deque()
        self.prompt_done: deque[tuple[float, int]] = deque()
        self.output_done: deque[tuple[float, int]] = deque()
        self.arrivals: deque[float] = deque()
        self.finished: list[Request] = []

    def resize(self, desired: int, now_s: float) -> None:
        live = [r for r in self.replicas if not r.draining]
        for _ in range(desired - len(live)):
            self.replicas.append(Replica(ready_at_s=now_s + self.cold_start_s))
        for replica in sorted(live, key=lambda r: -r.ready_at_s)[: max(0, len(live) - desired)]:
            replica.draining = True

    def arrive(self, request: Request) -> None:
        self.queue.append(request)
        self.arrivals.append(request.arrival_s)

    def step(self, now_s: float) -> None:
        self._admit(now_s)
        for replica in self.replicas:
            if replica.ready(now_s):
                self._run(replica, now_s)
        self.replicas = [r for r in self.replicas if not (r.draining and r.sequences == 0)]

    def _admit(self, now_s: float) -> None:
        while self.queue:
            request = self.queue[0]
            open_replicas = [
                r for r in self.replicas if r.ready(now_s) and not r.draining and r.fits(request)
            ]
            if not open_replicas:
                return
            replica = min(open_replicas, key=lambda r: r.reserved_kv_tokens)
            self.queue.popleft()
            waited_s = now_s - request.arrival_s
            request.admitted_s = now_s
            self.queue_waits.append((now_s, waited_s if waited_s > TICK_S else 0.0))
            replica.reserved_kv_tokens += request.kv_tokens
            replica.prefilling.append(request)

    def _run(self, replica: Replica, now_s: float) -> None:
        speed = replica.speed_ratio(now_s)
        budget = PREFILL_TOKENS_PER_S * speed * TICK_S
        spent = 0.0
        while replica.prefilling and budget > 0:
            request = replica.prefilling[0]
            take = min(budget, request.prompt_tokens - request.prefilled_tokens)
            request.prefilled_tokens += take
            budget -= take
            spent += take
            if request.prefilled_tokens >= request.prompt_tokens:
                replica.prefilling.popleft()
                request.first_token_s = now_s + spent / (PREFILL_TOKENS_PER_S * speed)
                request.produced_tokens = 1
                self.ttfts.append((now_s, request.first_token_s - request.arrival_s))
                self.prompt_done.append((now_s, request.prompt_tokens))
                replica.decoding.append(request)
        decode_s = TICK_S - spent / (PREFILL_TOKENS_PER_S * speed)
        itl_s = (ITL_BASE_S + ITL_PER_SEQUENCE_S * len(replica.decoding)) / speed
        still = []
        for request in replica.decoding:
            request.produced_tokens += decode_s / itl_s
            if request.produced_tokens >= request.output_tokens:
                replica.reserved_kv_tokens -= request.kv_tokens
                self.output_done.append((now_s, request.output_tokens))
                self.finished.append(request)
            else:
                still.append(request)
        replica.decoding = still

    def signals(self, now_s: float) -> PoolSignals:
        for series in (self.ttfts, self.queue_waits, self.prompt_done, self.output_done):
            while series and series[0][0] < now_s - WINDOW_S:
                series.popleft()
        while self.arrivals and self.arrivals[0] < now_s - WINDOW_S:
            self.arrivals.popleft()
        ready = [r for r in self.replicas if r.ready(now_s)]
        capacity = KV_CAPACITY_TOKENS * max(1, len(ready))
        waiting = sum(r.prompt_tokens for r in self.queue) + sum(
            int(q.prompt_tokens - q.prefilled_tokens) for r in ready for q in r.prefilling
        )
        return PoolSignals(
            time_s=now_s,
            pool="chat",
            role=Role.MIXED,
            replicas_current=sum(1 for r in self.replicas if not r.draining),
            replicas_ready=sum(1 for r in ready if not r.draining),
            kv_occupancy_ratio=sum(r.reserved_kv_tokens for r in ready) / capacity,
            ttft_p95_s=p95([v for _, v in self.ttfts]),
            itl_p95_s=None,
            queue_wait_p95_s=p95([v for _, v in self.queue_waits]),
            prompt_tokens_queued=waiting,
            resident_sequences=sum(r.sequences for r in ready),
            prompt_tokens_per_s=sum(n for _, n in self.prompt_done) / WINDOW_S,
            output_tokens_per_s=sum(n for _, n in self.output_done) / WINDOW_S,
        )

    def requests_per_s(self) -> float:
        return len(self.arrivals) / WINDOW_S


def baseline_capacity_rps() -> float:
    """Requests/s one warm replica sustains at the baseline mix: the lower of its prefill bound and
    its KV bound (sequences that fit, each resident for its decode time at that batch)."""
    mix = SCHEDULE[0]
    prefill_rps = PREFILL_TOKENS_PER_S / mix.prompt_tokens
    sequences = min(MAX_SEQUENCES, KV_CAPACITY_TOKENS // (mix.prompt_tokens + 1024))
    resident_s = mix.output_tokens * (ITL_BASE_S + ITL_PER_SEQUENCE_S * sequences)
    return min(prefill_rps, sequences / resident_s)


def p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(0.95 * len(ordered))) - 1]


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
    print(f"  burst requests TTFT p50 / p95       {_pct(ttfts, 0.5):>8.2f} s / {_pct(ttfts, 0.95):.2f} s")
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


def _pct(values: list[float], q: float) -> float:
    return values[max(1, math.ceil(q * len(values))) - 1] if values else math.nan


def plot(runs: dict[str, Timeline], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(11, 11), sharex=True)
    colors = {"work": "tab:blue", "conjunction": "tab:green", "requests": "tab:red"}
    labels = {
        "work": "kvgate policy",
        "conjunction": "kvgate policy, no capacity figures",
        "requests": "request-rate scaler",
    }
    for name, tl in runs.items():
        minutes = [t / 60 for t in tl.time_s]
        axes[0].plot(minutes, tl.prompt_tokens_per_s, color=colors[name], label=labels[name])
        axes[1].step(minutes, tl.replicas, where="post", color=colors[name], label=f"{labels[name]}: asked")
        axes[1].step(
            minutes, tl.ready, where="post", color=colors[name], linestyle=":", label=f"{labels[name]}: ready"
        )
        axes[2].plot(minutes, tl.ttft_p95_s, color=colors[name], label=labels[name])
        axes[3].plot(minutes, tl.occupancy_ratio, color=colors[name], label=labels[name])
    axes[2].axhline(1.5, color="grey", linestyle="--", linewidth=0.8)
    axes[3].axhline(0.8, color="grey", linestyle="--", linewidth=0.8)
    axes[3].axhline(0.35, color="grey", linestyle="--", linewidth=0.8)
    axes[2].set_yscale("log")
    titles = (
        "prompt tokens/s served (60 s)",
        "replicas",
        "TTFT p95 (s, 60 s window)",
        "KV occupancy (reserved)",
    )
    for ax, title in zip(axes, titles, strict=True):
        ax.set_ylabel(title)
        ax.axvspan(BURST[0] / 60, BURST[1] / 60, color="orange", alpha=0.12)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=8)
    axes[-1].set_xlabel("minutes (shaded: burst, 2x requests/s and 8x prompt length)")
    fig.suptitle("Same burst, two scaling signals: work (KV occupancy + TTFT + tokens) vs request rate")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# The real closed loop: `kvgate sim` + `kvgate serve` processes, the load generator, the actuator.

SCALE_RATIO = 6.0
"""Policy seconds per wall second in the real run: every window and the cold start are divided by it."""
REAL_PROFILE = "llama-3.1-70b-4xh100"
REAL_MODEL = "meta-llama/Llama-3.1-70B-Instruct"
REAL_KV_BYTES_PER_TOKEN = 327_680
REAL_PREFILL_TOKENS_PER_S = 12_000.0
"""The profile's measured prefill rate per replica (docs/simulator.md), the token-rate floor's C."""
REAL_BASE_PROMPT_TOKENS = 500
REAL_BURST_PROMPT_TOKENS = 8000
ADMIN_TOKEN = "bench-autoscale"


@dataclass(frozen=True, slots=True)
class RealPlan:
    base_rps: float
    warm_s: float
    burst_s: float
    tail_s: float
    cold_start_s: float
    seed: int

    @property
    def duration_s(self) -> float:
        return self.warm_s + self.burst_s + self.tail_s

    @property
    def burst(self) -> tuple[float, float]:
        return self.warm_s, self.warm_s + self.burst_s


def scaled_policy(plan: RealPlan) -> dict[str, Any]:
    """The seed's policy with every duration divided by ``SCALE_RATIO`` (latency targets unscaled)."""
    return {
        "interval_s": 15.0 / SCALE_RATIO,
        "signals_window_s": 60.0 / SCALE_RATIO,
        "policy": {
            "min_replicas": MIN_REPLICAS,
            "max_replicas": 8,
            "scale_out_window_s": 60.0 / SCALE_RATIO,
            "scale_in_window_s": 600.0 / SCALE_RATIO,
            "scale_down_delay_s": 300.0 / SCALE_RATIO,
            "growth_window_s": 60.0 / SCALE_RATIO,
            "backlog_drain_s": 60.0 / SCALE_RATIO,
            "cold_start_s": plan.cold_start_s,
            "prefill_capacity_tokens_per_s": REAL_PREFILL_TOKENS_PER_S,
            "scale_out_itl_s": 0.15,
            "scale_in_itl_s": 0.06,
        },
    }


def gateway_yaml(plan: RealPlan, replica_urls: list[str], port: int) -> dict[str, Any]:
    return {
        "server": {"port": port, "admin_token": ADMIN_TOKEN},
        "health": {"interval_s": 1.0, "timeout_s": 1.0},
        "routing": {"warmup_s": 30.0 / SCALE_RATIO},
        "models": [
            {"name": REAL_MODEL, "max_model_len": 131072, "kv_bytes_per_token": REAL_KV_BYTES_PER_TOKEN}
        ],
        "pools": [{"name": "default", "replicas": replica_urls, "kv_capacity_tokens": 420_000}],
        "autoscaler": scaled_policy(plan),
    }


def real_workloads(plan: RealPlan) -> list[Workload]:
    """The normal mix all along, plus as many requests again with 16x longer prompts in the burst."""
    start, end = plan.burst
    total = plan.duration_s
    output = {"lognormal": {"median": 120, "sigma": 0.4, "min": 20, "max": 400}}
    base = parse_workload(
        {
            "name": "normal",
            "api": "chat",
            "duration_s": total,
            "rate_rps": plan.base_rps,
            "classes": [
                {
                    "name": "normal",
                    "prompt_tokens": {
                        "lognormal": {"median": REAL_BASE_PROMPT_TOKENS, "sigma": 0.4, "min": 50, "max": 2000}
                    },
                    "output_tokens": output,
                }
            ],
        }
    )
    burst = parse_workload(
        {
            "name": "burst",
            "api": "chat",
            "duration_s": total,
            "rate_rps": plan.base_rps,
            "schedule": [[0.0, 0.0], [start / total, 1.0], [end / total, 0.0]],
            "classes": [
                {
                    "name": "long",
                    "prompt_tokens": {
                        "lognormal": {
                            "median": REAL_BURST_PROMPT_TOKENS,
                            "sigma": 0.3,
                            "min": 4000,
                            "max": 14000,
                        }
                    },
                    "output_tokens": output,
                }
            ],
        }
    )
    return [base, burst]


RealBrain = Callable[[dict[str, Any], float], Recommendation | None]
"""(the /signals document, seconds since the load started) -> what to ask the actuator for."""


def kvgate_brain(pool: str) -> RealBrain:
    """Acts on what the gateway's own policy publishes on /signals (as KEDA would on the metric)."""

    def decide(doc: dict[str, Any], now_s: float) -> Recommendation | None:
        p = doc["pools"][pool]
        if p.get("desired_replicas") is None:
            return None
        return Recommendation(pool, int(p["desired_replicas"]), str(p.get("desired_reason", "")))

    return decide


def request_rate_brain(pool: str, target_rps_per_replica: float, arrivals_s: list[float]) -> RealBrain:
    """HPA on ingress requests/s (arrivals over the signals window, as a load balancer counts them):
    up at once, down to the highest answer of the stabilisation window."""
    history: deque[tuple[float, int]] = deque()
    stabilization_s = 300.0 / SCALE_RATIO
    window_s = 60.0 / SCALE_RATIO

    def decide(doc: dict[str, Any], now_s: float) -> Recommendation | None:
        p = doc["pools"][pool]
        arrived = bisect.bisect_right(arrivals_s, now_s) - bisect.bisect_right(arrivals_s, now_s - window_s)
        raw = max(MIN_REPLICAS, math.ceil(arrived / window_s / target_rps_per_replica))
        history.append((now_s, raw))
        while history[0][0] < now_s - stabilization_s:
            history.popleft()
        current = int(p["replicas_current"])
        desired = raw if raw >= current else max(n for _, n in history)
        return Recommendation(pool, min(8, desired), "requests_per_s")

    return decide


@dataclass(slots=True)
class RealRun:
    name: str
    plan: RealPlan
    samples: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    """(seconds from the start of the load, the default pool of /signals)."""
    desired: list[tuple[float, int, str]] = field(default_factory=list)
    """(seconds, replicas the acting scaler asked for, its reason)."""
    records: list[tuple[float, RequestRecord]] = field(default_factory=list)
    """(seconds the request was sent, its record)."""
    offered: list[tuple[float, int]] = field(default_factory=list)
    """(send offset, prompt tokens) of every request of the traces."""
    sim_lag_ratio: float | None = None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _free_port_range(count: int) -> int:
    for _ in range(200):
        base = random.randrange(20_000, 50_000)
        try:
            socks = []
            for port in range(base, base + count):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
        return base
    raise RuntimeError("no free port range")


async def run_real(name: str, brain_name: str, plan: RealPlan, workdir: Path) -> RealRun:
    """One closed-loop run: fleet, gateway, actuator loop and load, all real processes and sockets."""
    kvgate = str(Path(sys.executable).with_name("kvgate"))
    sim_port = _free_port_range(12)
    control_port = sim_port + 11
    gateway_port = _free_port()
    sim_cmd = [
        kvgate, "sim", "--replicas", str(MIN_REPLICAS), "--port", str(sim_port),
        "--control-port", str(control_port), "--profile", REAL_PROFILE, "--model", REAL_MODEL,
        "--cold-start-s", "0", "--seed", str(plan.seed),
    ]  # fmt: skip
    urls = [f"http://127.0.0.1:{sim_port + i}" for i in range(MIN_REPLICAS)]
    config_path = workdir / f"{name}-gateway.yaml"
    config_path.write_text(yaml.safe_dump(gateway_yaml(plan, urls, gateway_port)))
    gateway_cmd = [kvgate, "serve", "--config", str(config_path), "--log-level", "warning"]
    logs = [open(workdir / f"{name}-{part}.log", "wb") for part in ("sim", "gateway")]  # noqa: SIM115
    procs = [
        subprocess.Popen(sim_cmd, stdout=logs[0], stderr=subprocess.STDOUT),
        subprocess.Popen(gateway_cmd, stdout=logs[1], stderr=subprocess.STDOUT),
    ]
    control_url = f"http://127.0.0.1:{control_port}"
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    run = RealRun(name, plan)
    try:
        traces = [build_trace(w, plan.seed, salt=i) for i, w in enumerate(real_workloads(plan))]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            await wait_until_ok(session, f"{control_url}/replicas")
            await wait_until_ok(session, f"{gateway_url}/readyz")
            actuator = SimActuator(
                session,
                {"default": control_url},
                cold_start_s=plan.cold_start_s,
                gateway_url=gateway_url,
                admin_token=ADMIN_TOKEN,
            )
            run.offered = sorted((r.at_s or 0.0, r.prompt_tokens) for trace in traces for r in trace.requests)
            brain = (
                kvgate_brain("default")
                if brain_name == "kvgate"
                else request_rate_brain(
                    "default",
                    baseline_real_capacity_rps() * UTILIZATION_TARGET,
                    [t for t, _ in run.offered],
                )
            )
            origin_s = time.monotonic()
            tasks = [
                asyncio.create_task(_record_signals(session, gateway_url, origin_s, run)),
                asyncio.create_task(_actuate(session, gateway_url, actuator, brain, origin_s, run)),
            ]
            target = Target(name, gateway_url, REAL_MODEL)
            options = RunOptions(signals_interval_s=3600.0)
            results = await asyncio.gather(*(runner_run(target, trace, options) for trace in traces))
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for result in results:
                offset_s = result.started_epoch_s - (time.time() - (time.monotonic() - origin_s))
                run.records += [(offset_s + r.sent_at_s, r) for r in result.records]
            run.records.sort(key=lambda item: item[0])
            run.sim_lag_ratio = await _sim_lag_ratio(session, control_url)
    finally:
        for proc in reversed(procs):
            proc.send_signal(signal.SIGTERM)
        for proc in reversed(procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in logs:
            log.close()
    return run


async def _record_signals(
    session: aiohttp.ClientSession, gateway_url: str, origin_s: float, run: RealRun
) -> None:
    while True:
        try:
            doc = await fetch_signals(session, gateway_url)
            run.samples.append((time.monotonic() - origin_s, doc["pools"]["default"]))
        except (aiohttp.ClientError, TimeoutError, KeyError) as exc:
            print(f"signals: {exc!r}", file=sys.stderr)
        await asyncio.sleep(1.0)


async def _actuate(
    session: aiohttp.ClientSession,
    gateway_url: str,
    actuator: SimActuator,
    brain: RealBrain,
    origin_s: float,
    run: RealRun,
) -> None:
    """The loop of ``kvgate autoscale --actuator sim``: read, decide, resize fleet and gateway."""
    interval_s = 15.0 / SCALE_RATIO
    while True:
        try:
            rec = brain(await fetch_signals(session, gateway_url), time.monotonic() - origin_s)
            if rec is not None:
                await actuator.apply(rec)
                run.desired.append((time.monotonic() - origin_s, rec.desired_replicas, rec.reason))
        except (aiohttp.ClientError, TimeoutError, KeyError) as exc:
            print(f"actuator: {exc!r}", file=sys.stderr)
        await asyncio.sleep(interval_s)


async def _sim_lag_ratio(session: aiohttp.ClientSession, control_url: str) -> float | None:
    """The worst replica's ``kvgate_sim_lag_ratio``: above 0.05 the simulator fell behind."""
    async with session.get(f"{control_url}/replicas") as response:
        replicas = (await response.json())["replicas"]
    worst: float | None = None
    for replica in replicas:
        if replica["state"] != "ready":
            continue
        async with session.get(f"{replica['url']}/metrics") as response:
            text = await response.text()
        for line in text.splitlines():
            if line.startswith("kvgate_sim_lag_ratio"):
                value = float(line.rsplit(" ", 1)[1])
                worst = value if worst is None else max(worst, value)
    return worst


def baseline_real_capacity_rps() -> float:
    """Requests/s one replica of the profile sustains at the normal mix: its prefill rate over the
    normal prompt (decode and KV allow more at this mix)."""
    return REAL_PREFILL_TOKENS_PER_S / REAL_BASE_PROMPT_TOKENS


def _series(run: RealRun, key: str) -> list[float]:
    return [float(p.get(key) or 0.0) for _, p in run.samples]


def client_ttft_p95(run: RealRun, bin_s: float = 5.0) -> tuple[list[float], list[float]]:
    """TTFT p95 of the requests sent in each ``bin_s`` (centre of the bin, seconds)."""
    bins: dict[int, list[float]] = {}
    for sent_s, record in run.records:
        if record.ttft_s is not None:
            bins.setdefault(int(sent_s // bin_s), []).append(record.ttft_s)
    keys = sorted(bins)
    return [(k + 0.5) * bin_s for k in keys], [p95(bins[k]) or 0.0 for k in keys]


def real_figures(run: RealRun) -> dict[str, Any]:
    start, end = run.plan.burst
    desired = run.desired
    out_at = next((t for t, n, _ in desired if t >= start and n > MIN_REPLICAS), None)
    peak = max((n for _, n, _ in desired), default=MIN_REPLICAS)
    changes = [(t, b - a) for (_, a, _), (t, b, _) in itertools.pairwise(desired) if b != a]
    reversals = sum(1 for (_, d0), (_, d1) in itertools.pairwise(changes) if (d0 > 0) != (d1 > 0))
    ttft = [(t, p.get("ttft_p95_s")) for t, p in run.samples]
    slow_at = next((t for t, v in ttft if t >= start and v is not None and v > 1.5), None)
    recovered_at = None
    if slow_at is not None:
        recovered_at = next((t for t, v in ttft if t > slow_at and (v is None or v < 1.5)), None)
    ready_peak = max((int(p.get("replicas_ready", 0)) for _, p in run.samples), default=0)
    burst_ttfts = sorted(r.ttft_s for t, r in run.records if start <= t < end and r.ttft_s is not None)
    errors = collections.Counter(
        f"{r.status} {r.error or ''}"[:120] for _, r in run.records if not r.ok and not r.rejected
    )
    rejected = sum(1 for _, r in run.records if r.rejected)
    scale_ins = [t for t, d in changes if d < 0]
    return {
        "first_scale_out_s": None if out_at is None else out_at - start,
        "ttft_over_1_5_s_at_s": None if slow_at is None else slow_at - start,
        "ttft_back_under_1_5_s_at_s": None if recovered_at is None else recovered_at - start,
        "peak_desired": peak,
        "peak_ready": ready_peak,
        "reversals": reversals,
        "scale_ins_after_burst_s": [round(t - end, 1) for t in scale_ins],
        "burst_ttft_p50_s": _pct(burst_ttfts, 0.5),
        "burst_ttft_p95_s": _pct(burst_ttfts, 0.95),
        "requests": len(run.records),
        "rejected_429": rejected,
        "errors": sum(errors.values()),
        "error_kinds": dict(errors.most_common(5)),
        "sim_lag_ratio": run.sim_lag_ratio,
        "reasons": dict(sorted(collections.Counter(reason for _, _, reason in desired).items())),
    }


def print_real(run: RealRun, figures: dict[str, Any]) -> None:
    def secs(value: float | None) -> str:
        return "never" if value is None else f"{value:+.0f} s"

    print(f"== {run.name} (times from burst start, wall seconds; x{SCALE_RATIO:g} = policy seconds)")
    print(f"  first scale-out asked              {secs(figures['first_scale_out_s'])}")
    print(f"  TTFT p95 (gateway) over 1.5 s      {secs(figures['ttft_over_1_5_s_at_s'])}")
    print(f"  TTFT p95 back under 1.5 s          {secs(figures['ttft_back_under_1_5_s_at_s'])}")
    print(f"  peak replicas asked / ready        {figures['peak_desired']} / {figures['peak_ready']}")
    print(f"  reversals of direction             {figures['reversals']}")
    print(f"  scale-ins, s after the burst       {figures['scale_ins_after_burst_s']}")
    print(
        f"  burst requests TTFT p50 / p95      {figures['burst_ttft_p50_s']:.2f} s / "
        f"{figures['burst_ttft_p95_s']:.2f} s"
    )
    print(
        f"  requests / 429 / other errors      {figures['requests']} / {figures['rejected_429']} / "
        f"{figures['errors']} {figures['error_kinds'] or ''}"
    )
    print(f"  simulator lag ratio (worst)        {figures['sim_lag_ratio']}")
    print(f"  answers by reason                  {figures['reasons']}")


def plot_real(runs: list[RealRun], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(10, 10), sharex=True)
    colors = {"kvgate": "tab:blue", "requests": "tab:red"}
    labels = {"kvgate": "kvgate policy (KV, TTFT, tokens)", "requests": "requests/s scaler"}
    first = runs[0]
    bin_s = 5.0
    bins = [k * bin_s for k in range(int(first.plan.duration_s // bin_s) + 1)]
    counts = [0.0] * len(bins)
    tokens = [0.0] * len(bins)
    for at_s, prompt_tokens in first.offered:
        k = min(int(at_s // bin_s), len(bins) - 1)
        counts[k] += 1 / bin_s
        tokens[k] += prompt_tokens / bin_s
    axes[0].step(bins, counts, where="post", color="black", label="requests/s offered")
    tokens_axis = axes[0].twinx()
    tokens_axis.step(bins, tokens, where="post", color="tab:purple", label="prompt tokens/s offered")
    tokens_axis.set_ylabel("prompt tokens/s", color="tab:purple", fontsize=8)
    tokens_axis.legend(loc="upper right", fontsize=7)
    for run in runs:
        color = colors[run.name]
        ts = [t for t, _ in run.samples]
        axes[1].step(
            [t for t, _, _ in run.desired],
            [n for _, n, _ in run.desired],
            where="post",
            color=color,
            label=f"{labels[run.name]}: asked",
        )
        axes[1].step(
            ts, _series(run, "replicas_ready"), where="post", color=color, linestyle=":", label="ready"
        )
        axes[2].plot(ts, _series(run, "kv_occupancy_scraped_ratio"), color=color, label=f"{labels[run.name]}")
        axes[2].plot(ts, _series(run, "kv_occupancy_estimate_ratio"), color=color, linestyle=":", alpha=0.6)
        ttft_bins, p95s = client_ttft_p95(run)
        axes[3].plot(ttft_bins, p95s, color=color, label=labels[run.name])
    axes[2].axhline(0.8, color="grey", linestyle="--", linewidth=0.8)
    axes[2].axhline(0.35, color="grey", linestyle="--", linewidth=0.8)
    axes[3].axhline(1.5, color="grey", linestyle="--", linewidth=0.8)
    axes[3].set_yscale("log")
    titles = (
        "offered load (requests/s)",
        "replicas (solid asked, dotted ready)",
        "KV occupancy (solid scraped, dotted reserved)",
        "client TTFT p95 (s, 5 s bins)",
    )
    start, end = first.plan.burst
    for ax, title in zip(axes, titles, strict=True):
        ax.set_ylabel(title, fontsize=8)
        ax.axvspan(start, end, color="orange", alpha=0.12)
        ax.grid(alpha=0.3)
        ax.legend(loc="center right", fontsize=7)
    axes[-1].set_xlabel(
        f"wall seconds (x{SCALE_RATIO:g} = policy seconds; shaded: burst, 2x requests/s with 16x prompts)"
    )
    fig.suptitle(
        f"Real closed loop: kvgate sim ({REAL_PROFILE}) + kvgate serve + load generator + sim actuator",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mode", choices=["real", "model"], default="real", help="default real")
    parser.add_argument("--out", default="autoscale.png", help="PNG path (default autoscale.png)")
    parser.add_argument(
        "--cold-start-s",
        type=float,
        default=None,
        help=f"replica cold start (default: model 120, real {180 / SCALE_RATIO:g} wall s)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--end-s", type=float, default=SCHEDULE[-1].until_s, help="model: simulated seconds")
    parser.add_argument(
        "--scalers", default="kvgate,requests", help="real: runs, of kvgate and requests (default both)"
    )
    parser.add_argument("--base-rps", type=float, default=3.0, help="real: normal requests/s (default 3)")
    parser.add_argument("--warm-s", type=float, default=30.0, help="real: seconds before the burst")
    parser.add_argument("--burst-s", type=float, default=120.0, help="real: burst seconds")
    parser.add_argument("--tail-s", type=float, default=210.0, help="real: seconds after the burst")
    parser.add_argument("--json", default=None, help="real: write the figures as JSON here")
    args = parser.parse_args()
    if args.mode == "model":
        cold_start_s = 120.0 if args.cold_start_s is None else args.cold_start_s
        runs = {}
        for name in ("work", "conjunction", "requests"):
            timeline, fleet = simulate(name, args.end_s, cold_start_s, args.seed)
            summarize(name, timeline, fleet)
            runs[name] = timeline
        plot(runs, args.out)
        print(f"plot: {args.out}")
        return 0
    plan = RealPlan(
        base_rps=args.base_rps,
        warm_s=args.warm_s,
        burst_s=args.burst_s,
        tail_s=args.tail_s,
        cold_start_s=180.0 / SCALE_RATIO if args.cold_start_s is None else args.cold_start_s,
        seed=args.seed,
    )
    real_runs: list[RealRun] = []
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="kvgate-autoscale-") as workdir:
        for name in args.scalers.split(","):
            run = asyncio.run(run_real(name, name, plan, Path(workdir)))
            figures[name] = real_figures(run)
            print_real(run, figures[name])
            real_runs.append(run)
    plot_real(real_runs, args.out)
    if args.json is not None:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    print(f"plot: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
