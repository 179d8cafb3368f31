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
longer estimate is sent as the cap with ``x-should-retry: false`` (which the openai SDKs obey): the
honest wait is longer than a client waits, so the gateway says so rather than promise a slot it
cannot keep. So is an estimate behind which no room is held (``promised=False``: the request could
not be recognised coming back, or the promises' share of the fleet is taken): room that frees then
goes to whoever asks first, so the number is a forecast, not a time the gateway can stand behind.
"""

from __future__ import annotations

import bisect
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
    pending_prompt_tokens: int
    expected_decode_tokens: float


@dataclass(frozen=True, slots=True)
class ReplicaDrain:
    """One routable replica's state for the drain estimate."""

    replica_id: str
    kv_room_tokens: int
    kv_capacity_tokens: int
    active_sequences: int
    max_active_sequences: int
    completions: tuple[tuple[float, int], ...]
    """(seconds from now, KV tokens freed) per resident sequence, earliest first: ``completions_s``."""


@dataclass(frozen=True, slots=True)
class Backlog:
    """Queued work that will be served before the request in question."""

    requests: float = 0.0
    kv_tokens: float = 0.0
    prompt_tokens: float = 0.0
    expected_output_tokens: float = 0.0


@dataclass(frozen=True, slots=True)
class RetryAfter:
    seconds: int
    """``Retry-After``: whole seconds, rounded up, at least 1."""
    milliseconds: int
    """``retry-after-ms``: the same estimate in milliseconds, rounded up."""
    expected_s: float
    """The uncapped estimate (may be ``inf``): for metrics and logs, not for headers."""
    honest: bool = True
    """The gateway stands behind the time: within the cap, with room held for the client coming
    back. False when the honest wait is longer than clients wait or no room is held, which the
    headers say with ``x-should-retry: false``."""

    def headers(self) -> dict[str, str]:
        headers = {"retry-after": str(self.seconds), "retry-after-ms": str(self.milliseconds)}
        if not self.honest:
            headers["x-should-retry"] = "false"
        return headers


def retry_after(expected_s: float, cap_s: float, promised: bool = True) -> RetryAfter:
    capped_s = min(max(expected_s, 0.001), cap_s)
    milliseconds = max(1, math.ceil(round(capped_s * 1000.0, 6)))
    seconds = max(1, math.ceil(milliseconds / 1000.0))
    return RetryAfter(seconds, milliseconds, expected_s, promised and expected_s <= cap_s)


def completions_s(resident: Sequence[ResidentWork], rates: ServiceRates) -> tuple[tuple[float, int], ...]:
    """(seconds from now, KV tokens freed) for each resident sequence, in reservation order given,
    earliest completion first."""
    times: list[tuple[float, int]] = []
    prefill_ahead_tokens = 0
    for work in resident:
        prefill_ahead_tokens += work.pending_prompt_tokens
        prefill_done_s = (
            prefill_ahead_tokens / rates.prefill_tokens_per_s if work.pending_prompt_tokens else 0.0
        )
        times.append((prefill_done_s + work.expected_decode_tokens * rates.inter_token_s, work.kv_tokens))
    times.sort()
    return tuple(times)


@dataclass(frozen=True, slots=True)
class FleetDrain:
    """The routable replicas' completions merged in time, with running fleet room and free slots,
    so each estimate is a few binary searches; build once per fleet state with ``of``."""

    replicas: tuple[ReplicaDrain, ...]
    freed_tokens: tuple[tuple[int, ...], ...]
    """Per replica, running KV tokens freed after each of its completions."""
    times_s: tuple[float, ...]
    kv_room_tokens: tuple[int, ...]
    """Fleet KV room after each completion in ``times_s``."""
    free_slots: tuple[int, ...]
    start_kv_room_tokens: int
    start_free_slots: int

    @classmethod
    def of(cls, replicas: Sequence[ReplicaDrain]) -> FleetDrain:
        freed: list[tuple[int, ...]] = []
        events: list[list[tuple[float, int, int]]] = []
        for r in replicas:
            running = 0
            mine: list[int] = []
            gains: list[tuple[float, int, int]] = []
            for j, (t, tokens) in enumerate(r.completions):
                running += tokens
                mine.append(running)
                gains.append((t, tokens, 1 if r.active_sequences - j <= r.max_active_sequences else 0))
            freed.append(tuple(mine))
            events.append(gains)
        room = sum(r.kv_room_tokens for r in replicas)
        slots = sum(max(0, r.max_active_sequences - r.active_sequences) for r in replicas)
        times: list[float] = []
        rooms: list[int] = []
        free: list[int] = []
        running_room, running_slots = room, slots
        for t, tokens, slot in heapq.merge(*events):
            running_room += tokens
            running_slots += slot
            times.append(t)
            rooms.append(running_room)
            free.append(running_slots)
        return cls(tuple(replicas), tuple(freed), tuple(times), tuple(rooms), tuple(free), room, slots)


def drain_wait_s(kv_tokens: int, fleet: FleetDrain, backlog: Backlog, rates: ServiceRates) -> float:
    """Expected seconds until a request needing ``kv_tokens`` fits behind ``backlog``; ``inf`` if no
    replica could ever hold it.

    Both conditions only become true as completions accumulate (room grows, sequences leave), so
    the answer is the later of the first instant some replica fits and the first instant the fleet
    holds the backlog too.
    """
    fitting = [r for r in fleet.replicas if r.kv_capacity_tokens >= kv_tokens and r.max_active_sequences > 0]
    if not fitting:
        return math.inf
    fit_s = min(
        (
            t
            for r, freed in zip(fleet.replicas, fleet.freed_tokens, strict=True)
            if (t := _first_fit_s(r, freed, kv_tokens)) is not None
        ),
        default=None,
    )
    fleet_s = _first_fleet_s(fleet, kv_tokens + backlog.kv_tokens, 1 + backlog.requests)
    if fit_s is not None and fleet_s is not None:
        return max(fit_s, fleet_s)
    last_s = fleet.times_s[-1] if fleet.times_s else 0.0
    return last_s + _waves_s(kv_tokens, fitting, backlog, rates)


def _first_fit_s(replica: ReplicaDrain, freed: tuple[int, ...], kv_tokens: int) -> float | None:
    if replica.kv_room_tokens >= kv_tokens and replica.active_sequences < replica.max_active_sequences:
        return 0.0
    by_room = bisect.bisect_left(freed, kv_tokens - replica.kv_room_tokens)
    by_slot = max(0, replica.active_sequences - replica.max_active_sequences)
    index = max(by_room, by_slot)
    return replica.completions[index][0] if index < len(freed) else None


def _first_fleet_s(fleet: FleetDrain, need_room: float, need_slots: float) -> float | None:
    if fleet.start_kv_room_tokens >= need_room and fleet.start_free_slots >= need_slots:
        return 0.0
    index = max(
        bisect.bisect_left(fleet.kv_room_tokens, need_room), bisect.bisect_left(fleet.free_slots, need_slots)
    )
    return fleet.times_s[index] if index < len(fleet.times_s) else None


def _waves_s(
    kv_tokens: int, replicas: Sequence[ReplicaDrain], backlog: Backlog, rates: ServiceRates
) -> float:
    """Time to serve ``backlog`` on an empty fleet, at the parallelism a request of ``kv_tokens`` allows."""
    capacity = sum(r.kv_capacity_tokens for r in replicas)
    slots = sum(r.max_active_sequences for r in replicas)
    parallel = max(1, min(slots, capacity // max(1, kv_tokens)))
    prefill_s = backlog.prompt_tokens / (rates.prefill_tokens_per_s * len(replicas))
    decode_s = backlog.expected_output_tokens * rates.inter_token_s / parallel
    return prefill_s + decode_s
