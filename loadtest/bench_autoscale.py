"""Closed-loop autoscaling benchmark: a burst of heavier requests against two scaling signals.

A token-level fluid model of a vLLM fleet runs on a manual clock (0.1 s ticks): kvgate's
admission queue in front, routing to the replica with the most KV room, reservations of
``prompt + max_output`` tokens against each replica's KV capacity, chunked prefill at a fixed token
rate, and decode whose inter-token latency grows with the batch. Replicas the scaler asks for
cold-start for ``--cold-start-s`` and then ramp from 30 % to full speed over a minute; removed ones
drain. Every 15 s the scaler reads the fleet's signals and resizes it.

Three scalers see the same seeded trace. ``work`` is kvgate's policy (``autoscaler.policy``, pure,
defaults plus the model's prefill capacity: KV occupancy and TTFT p95 conjunction, queue wait on a
full pool, token-rate floor with the waiting backlog). ``conjunction`` is the same policy without
capacity figures (the shipped default): only the seed's conjunction rules, +25 % per step.
``requests`` is the conventional one: replicas = ceil(requests/s over 60 s / per-replica target),
HPA-style (up at once, down after 300 s), its target the requests/s one replica sustains at the
baseline mix (what a load test at that mix measures) times the same 0.75 utilisation target. The burst
doubles the request rate *and* quadruples prompt length, the shift a request counter cannot see.
Prints the timeline figures and writes a PNG with both runs on one plot. Not a test: numbers only.

    .venv/bin/python -m loadtest.bench_autoscale [--out autoscale.png] [--cold-start-s 120]
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from autoscaler.policy import Autoscaler
from autoscaler.signals import PoolSignals
from config.autoscaler import AutoscalerConfig, PoolPolicy
from routing.replica import Role

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


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="autoscale.png", help="PNG path (default autoscale.png)")
    parser.add_argument("--cold-start-s", type=float, default=120.0, help="replica cold start (default 120)")
    parser.add_argument("--end-s", type=float, default=SCHEDULE[-1].until_s, help="simulated seconds")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    runs = {}
    for name in ("work", "conjunction", "requests"):
        timeline, fleet = simulate(name, args.end_s, args.cold_start_s, args.seed)
        summarize(name, timeline, fleet)
        runs[name] = timeline
    plot(runs, args.out)
    print(f"plot: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
