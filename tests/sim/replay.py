"""A token-level fleet model on a manual clock, for replaying traces against the real routers.

Each replica prefills one request at a time, first come first served, at ``prefill_tokens_per_s``
(blocks found in its prefix cache are skipped), then decodes the request's output at one token per
``decode_s_per_token`` alongside every other resident sequence (decode speed does not depend on the
batch: the model is about where tokens sit, not about latency). So a request's whole timeline is
fixed when it arrives, and KV occupancy at any instant is the sum over resident sequences of prompt
plus tokens produced so far. The prefix cache is an LRU of block hashes with a fixed capacity, like
vLLM's cache of freed blocks. Views handed to the router carry kvgate's exact accounting (prefill
pending, resident sequences, remaining decode, worst-case KV reserved), as the gateway's ledger
would. A request no replica can take waits and is offered again ``retry_after_s`` later. No
sockets, no event loop, no wall clock: one run is a deterministic function of its inputs.
"""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kvgate.config.routing import RoutingConfig
from kvgate.routing.decision import RoutingDecision
from kvgate.routing.prefix_hash import BLOCK_SIZE_TOKENS, block_hashes
from kvgate.routing.request import RoutingRequest
from kvgate.routing.router import Router
from kvgate.vocabulary.replica import ReplicaLoad, ReplicaView, Role

MODEL = "sim-model"


@dataclass(frozen=True, slots=True)
class TraceRequest:
    arrival_s: float
    request: RoutingRequest


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    replica_id: str
    kv_capacity_tokens: int = 200_000
    max_sequences: int = 256
    prefill_tokens_per_s: float = 20_000.0
    decode_s_per_token: float = 0.02
    cache_capacity_blocks: int = 4_096
    ready_since_s: float = -3_600.0


@dataclass(slots=True)
class _Sequence:
    prompt_tokens: int
    uncached_tokens: int
    max_output_tokens: int
    arrival_s: float
    first_token_s: float
    finish_s: float
    decode_s_per_token: float

    def produced(self, now_s: float) -> int:
        if now_s <= self.first_token_s:
            return 0
        return min(self.max_output_tokens, int((now_s - self.first_token_s) / self.decode_s_per_token))


@dataclass(slots=True)
class _Replica:
    spec: ReplicaSpec
    prefill_free_s: float = float("-inf")
    resident: list[_Sequence] = field(default_factory=list)
    cache: OrderedDict[int, None] = field(default_factory=OrderedDict)

    def expire(self, now_s: float) -> None:
        self.resident = [s for s in self.resident if s.finish_s > now_s]

    def kv_tokens(self, now_s: float) -> int:
        return sum(s.prompt_tokens + s.produced(now_s) for s in self.resident if s.arrival_s <= now_s)

    def view(self, now_s: float) -> ReplicaView:
        pending = resident = remaining = reserved = uncached = 0
        for s in self.resident:
            resident += 1
            reserved += s.prompt_tokens + s.max_output_tokens
            remaining += s.max_output_tokens - s.produced(now_s)
            if s.first_token_s > now_s:
                pending += s.prompt_tokens
                uncached += s.uncached_tokens
        spec = self.spec
        return ReplicaView(
            replica_id=spec.replica_id,
            url=f"sim://{spec.replica_id}",
            pool="default",
            role=Role.MIXED,
            models=frozenset({MODEL}),
            kv_capacity_tokens=spec.kv_capacity_tokens,
            max_sequences=spec.max_sequences,
            healthy=True,
            ready_since_s=spec.ready_since_s if spec.ready_since_s <= now_s else None,
            load=ReplicaLoad(pending, resident, remaining, reserved, uncached),
        )

    def admit(self, request: RoutingRequest, now_s: float) -> int:
        """Start ``request`` here; returns the prompt blocks its prefix cache already held."""
        hit_blocks = 0
        for h in request.block_hashes:
            if h not in self.cache:
                break
            hit_blocks += 1
        for h in request.block_hashes:
            self.cache[h] = None
            self.cache.move_to_end(h)
        while len(self.cache) > self.spec.cache_capacity_blocks:
            self.cache.popitem(last=False)
        uncached_tokens = request.prompt_tokens - hit_blocks * BLOCK_SIZE_TOKENS
        start_s = max(now_s, self.prefill_free_s)
        first_token_s = start_s + uncached_tokens / self.spec.prefill_tokens_per_s
        self.prefill_free_s = first_token_s
        tpot_s = self.spec.decode_s_per_token
        self.resident.append(
            _Sequence(
                request.prompt_tokens,
                uncached_tokens,
                request.max_output_tokens,
                now_s,
                first_token_s,
                first_token_s + request.max_output_tokens * tpot_s,
                tpot_s,
            )
        )
        return hit_blocks


@dataclass(frozen=True, slots=True)
class Placement:
    arrival_s: float
    routed_s: float
    request: RoutingRequest
    decision: RoutingDecision
    hit_blocks: int
    views: tuple[ReplicaView, ...]


@dataclass(slots=True)
class ReplayResult:
    placements: list[Placement]
    kv_samples: list[tuple[float, dict[str, int]]]
    """(time, KV tokens resident per replica) every ``sample_every_s``."""

    def hit_ratio(self) -> float:
        blocks = sum(len(p.request.block_hashes) for p in self.placements)
        return sum(p.hit_blocks for p in self.placements) / blocks if blocks else 0.0

    def share(self, replica_id: str, start_s: float, end_s: float) -> float:
        window = [p for p in self.placements if start_s <= p.routed_s < end_s]
        return sum(1 for p in window if p.decision.replica_id == replica_id) / len(window)


def run(
    specs: Sequence[ReplicaSpec],
    trace: Iterable[TraceRequest],
    config: RoutingConfig,
    *,
    sample_every_s: float = 1.0,
    retry_after_s: float = 0.5,
) -> ReplayResult:
    router = Router(config, random.Random(config.seed))
    replicas = [_Replica(spec) for spec in specs]
    prefill_tokens_per_s = min(spec.prefill_tokens_per_s for spec in specs)
    events: list[tuple[float, int, TraceRequest | None]] = []
    order = 0
    last_arrival_s = 0.0
    for offered in trace:
        heapq.heappush(events, (offered.arrival_s, order, offered))
        order += 1
        last_arrival_s = max(last_arrival_s, offered.arrival_s)
    sample_s = 0.0
    while sample_s <= last_arrival_s:
        heapq.heappush(events, (sample_s, order, None))
        order += 1
        sample_s += sample_every_s
    placements: list[Placement] = []
    kv_samples: list[tuple[float, dict[str, int]]] = []
    while events:
        now_s, _, item = heapq.heappop(events)
        for replica in replicas:
            replica.expire(now_s)
        if item is None:
            kv_samples.append((now_s, {r.spec.replica_id: r.kv_tokens(now_s) for r in replicas}))
            continue
        views = tuple(replica.view(now_s) for replica in replicas)
        decision = router.choose(item.request, views, now_s, prefill_tokens_per_s=prefill_tokens_per_s)
        if decision.replica_id is None:
            heapq.heappush(events, (now_s + retry_after_s, order, item))
            order += 1
            continue
        target = next(r for r in replicas if r.spec.replica_id == decision.replica_id)
        hit_blocks = target.admit(item.request, now_s)
        placements.append(Placement(item.arrival_s, now_s, item.request, decision, hit_blocks, views))
    return ReplayResult(placements, kv_samples)


def poisson_arrivals(rng: random.Random, rate_per_s: float, duration_s: float) -> list[float]:
    arrivals: list[float] = []
    now_s = rng.expovariate(rate_per_s)
    while now_s < duration_s:
        arrivals.append(now_s)
        now_s += rng.expovariate(rate_per_s)
    return arrivals


def prompt_request(token_ids: Sequence[int], max_output_tokens: int) -> RoutingRequest:
    return RoutingRequest(MODEL, len(token_ids), max_output_tokens, tuple(block_hashes(token_ids)))
