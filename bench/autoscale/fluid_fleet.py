"""A token-level fluid model of a fleet on a manual clock, for ``--mode model``.

Requests arrive on a seeded trace (a baseline mix, then a burst of twice the rate with eight times
the prompt); kvgate's admission queue sits in front and routes each to the ready replica with the
most KV room, reserving ``prompt + max_output`` tokens against its capacity. A replica prefills in
chunks at a fixed token rate and decodes with an inter-token latency that grows with its batch,
both slower while it warms up after a cold start. ``Fleet.signals`` reads it as the gateway's
``/signals`` would, over a 60 s window.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field

from bench.autoscale.scenario import p95
from kvgate.autoscaler.signals import PoolSignals
from kvgate.vocabulary.replica import Role

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
