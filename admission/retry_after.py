"""How long until a request would fit: the number behind Retry-After and the queue-or-reject choice.

Reserved KV comes back when resident sequences finish. A sequence finishes after its pending
prefill (pending prompt tokens on its replica, in reservation order, at the observed prefill rate)
and its expected remaining decode tokens (learned output lengths, never more than its cap) at the
observed inter-token latency. Walking those completions in time order, the wait is the first
instant at which some replica has room and a sequence slot for the request and the fleet as a
whole has room for the queued work ahead of it as well. When even a fully drained fleet cannot
hold the work ahead at once, that work is served in waves at the fleet's parallelism. The result is
monotone: more resident work or more work ahead never shortens it.

Headers: ``Retry-After`` is whole seconds rounded up (at least 1, since the OpenAI SDKs ignore 0)
and ``retry-after-ms`` milliseconds rounded up, both from the same estimate, capped at a limit the
official SDKs honour. openai-python retries after ``retry-after-ms``/``Retry-After`` only when
``0 < value <= MAX_RETRY_AFTER_DELAY``: 60 s in older releases (which otherwise back off for at
most 8 s, hammering the gateway) and 120 s in current ones (which otherwise do not retry at all). A
longer estimate is therefore sent as the cap: the client comes back at the cap and is told again.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ServiceRates:
    """Observed speeds, fed by the edge from smoothed measurements."""

    inter_token_s: float
    prefill_tokens_per_s: float


@dataclass(frozen=True, slots=True)
class ResidentWork:
    kv_tokens: int
    prefill_tokens_pending: int
    expected_decode_tokens: float


@dataclass(frozen=True, slots=True)
class ReplicaDrain:
    """One routable replica's state for the drain estimate, resident work in reservation order."""

    replica_id: str
    room_kv_tokens: int
    capacity_kv_tokens: int
    active_sequences: int
    max_active_sequences: int
    resident: tuple[ResidentWork, ...]


@dataclass(frozen=True, slots=True)
class Backlog:
    """Queued work that will be served before the request in question."""

    requests: int = 0
    kv_tokens: int = 0
    prompt_tokens: int = 0
    expected_output_tokens: float = 0.0


@dataclass(frozen=True, slots=True)
class RetryAfter:
    seconds: int
    """``Retry-After``: whole seconds, rounded up, at least 1."""
    milliseconds: int
    """``retry-after-ms``: the same estimate in milliseconds, rounded up."""
    expected_s: float
    """The uncapped estimate (may be ``inf``): for metrics and logs, not for headers."""

    def headers(self) -> dict[str, str]:
        return {"retry-after": str(self.seconds), "retry-after-ms": str(self.milliseconds)}


def retry_after(expected_s: float, cap_s: float) -> RetryAfter:
    capped_s = min(max(expected_s, 0.001), cap_s)
    milliseconds = max(1, math.ceil(round(capped_s * 1000.0, 6)))
    seconds = max(1, math.ceil(milliseconds / 1000.0))
    return RetryAfter(seconds, milliseconds, expected_s)


def completion_times_s(replica: ReplicaDrain, rates: ServiceRates) -> list[tuple[float, int]]:
    """(seconds from now, KV tokens freed) for each resident sequence of ``replica``."""
    times: list[tuple[float, int]] = []
    prefill_ahead_tokens = 0
    for work in replica.resident:
        prefill_ahead_tokens += work.prefill_tokens_pending
        prefill_done_s = (
            prefill_ahead_tokens / rates.prefill_tokens_per_s if work.prefill_tokens_pending else 0.0
        )
        times.append((prefill_done_s + work.expected_decode_tokens * rates.inter_token_s, work.kv_tokens))
    return times


def drain_wait_s(
    kv_tokens: int, replicas: Sequence[ReplicaDrain], backlog: Backlog, rates: ServiceRates
) -> float:
    """Expected seconds until a request needing ``kv_tokens`` fits behind ``backlog``; ``inf`` if no
    replica could ever hold it."""
    fitting = [r for r in replicas if r.capacity_kv_tokens >= kv_tokens and r.max_active_sequences > 0]
    if not fitting:
        return math.inf
    room = {r.replica_id: r.room_kv_tokens for r in replicas}
    active = {r.replica_id: r.active_sequences for r in replicas}
    limit = {r.replica_id: r.max_active_sequences for r in replicas}
    fleet_room = sum(room.values())
    fleet_slots = sum(max(0, limit[i] - active[i]) for i in room)
    events = [(t, freed, r.replica_id) for r in replicas for t, freed in completion_times_s(r, rates)]
    heapq.heapify(events)

    def satisfied() -> bool:
        if fleet_room < kv_tokens + backlog.kv_tokens or fleet_slots < 1 + backlog.requests:
            return False
        return any(room[i] >= kv_tokens and active[i] < limit[i] for i in room)

    now_s = 0.0
    if satisfied():
        return now_s
    while events:
        now_s, freed, replica_id = heapq.heappop(events)
        room[replica_id] += freed
        fleet_room += freed
        if active[replica_id] <= limit[replica_id]:
            fleet_slots += 1
        active[replica_id] -= 1
        if satisfied():
            return now_s
    return now_s + _waves_s(kv_tokens, fitting, backlog, rates)


def _waves_s(
    kv_tokens: int, replicas: Sequence[ReplicaDrain], backlog: Backlog, rates: ServiceRates
) -> float:
    """Time to serve ``backlog`` on an empty fleet, at the parallelism a request of ``kv_tokens`` allows."""
    capacity = sum(r.capacity_kv_tokens for r in replicas)
    slots = sum(r.max_active_sequences for r in replicas)
    parallel = max(1, min(slots, capacity // max(1, kv_tokens)))
    prefill_s = backlog.prompt_tokens / (rates.prefill_tokens_per_s * len(replicas))
    decode_s = backlog.expected_output_tokens * rates.inter_token_s / parallel
    return prefill_s + decode_s
