"""The bounded wait queue: who goes next when capacity frees up.

Order: strict priority class first; within a class, fairness across tenants by tokens with a
virtual token counter per tenant (a tenant's counter grows by ``kv_tokens / weight`` of each request
it gets dispatched, the tenant with the smallest counter goes next, and a tenant that was idle is
lifted to the smallest counter among waiting tenants, or to the counter of the last tenant served
when none waits, so idle time banks no credit); within a
tenant, arrival order. Under contention each tenant's share of dispatched tokens converges to its
share of the weights, so a tenant sending 30k-token prompts cannot starve one sending 50-token chats.

A request that came back to claim a promised slot (``promised_due_s``) goes before every other
entry of its class, earliest slot first; it never passes a higher class.

Head of line: ``walk`` visits entries in that order and lets an entry that does not fit be bypassed
by later ones that do, but only until it has waited ``hold_after_s``; from then on nothing behind it
is dispatched, so capacity accumulates for it as resident work drains. Small requests are never
blocked for longer than that hold, and a large one waits at most the hold plus one drain.

Bounds are in requests and in KV tokens (prompt + max output). Removal by ticket is immediate (a
disconnected client's request stops counting at once); deadlines are kept in a heap.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kvgate.admission.decision import AdmissionRequest
from kvgate.admission.tenants import Tenant
from kvgate.vocabulary.replica import ReplicaView


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    ticket: int
    request: AdmissionRequest
    enqueued_at_s: float
    expires_at_s: float
    promised_due_s: float | None = None
    """Set when the request came back to claim a promised slot (due then): it goes at the head of
    its class."""

    @property
    def kv_tokens(self) -> int:
        return self.request.cost.kv_tokens

    @property
    def rank(self) -> int:
        return self.request.tenant.priority.rank


@dataclass(frozen=True, slots=True)
class QueueStats:
    requests: int
    kv_tokens: int
    prompt_tokens: int
    oldest_wait_s: float
    promised_requests: int = 0
    """Refused requests holding a promised slot (``kvgate.admission.promises``), filled by the controller."""


@dataclass(frozen=True, slots=True)
class Walk:
    placed: list[tuple[QueuedRequest, tuple[ReplicaView, ...]]]
    holding: QueuedRequest | None
    """The aged entry that capacity is being held for, if any: the walk stopped there."""


@dataclass(frozen=True, slots=True)
class Ahead:
    """Queued work expected to be dispatched before a given request (fractions where fairness
    interleaves tenants, hence floats)."""

    requests: float = 0.0
    kv_tokens: float = 0.0
    prompt_tokens: float = 0.0
    max_output_tokens: float = 0.0


Place = Callable[[QueuedRequest], tuple[ReplicaView, ...] | None]
"""Tries to place an entry on the simulated fleet: the candidates it fits on, () if it does not
fit, None when nothing more can fit anywhere (the walk stops)."""


class WaitQueue:
    def __init__(self, max_requests: int, max_kv_tokens: int, hold_after_s: float) -> None:
        self.max_requests = max_requests
        self.max_kv_tokens = max_kv_tokens
        self.hold_after_s = hold_after_s
        self._classes: dict[int, dict[str, dict[int, QueuedRequest]]] = {}
        self._entries: dict[int, QueuedRequest] = {}
        self._heads: dict[int, dict[int, QueuedRequest]] = {}
        """rank -> claimants of promised slots (also in ``_classes``), served first in their class."""
        self._counters: dict[str, float] = {}
        self._virtual_time = 0.0
        """Counter of the most recently served tenant before its charge: where an idle tenant rejoins."""
        self._deadlines: list[tuple[float, int]] = []
        self._kv_tokens = 0
        self._prompt_tokens = 0
        self._sums: dict[tuple[int, str], dict[str, list[int]]] = {}
        """(rank, tenant) -> model -> [requests, kv, prompt, max output] queued."""

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, ticket: int) -> bool:
        return ticket in self._entries

    def has_room(self, kv_tokens: int, held_requests: int = 0, held_kv_tokens: int = 0) -> bool:
        """Room for one more request of ``kv_tokens``, counting ``held_*`` (promised slots) too."""
        return (
            len(self._entries) + held_requests < self.max_requests
            and self._kv_tokens + held_kv_tokens + kv_tokens <= self.max_kv_tokens
        )

    def push(self, entry: QueuedRequest) -> None:
        tenants = self._classes.setdefault(entry.rank, {})
        name = entry.request.tenant.name
        self._counters[name] = max(self._counters.get(name, 0.0), self._floor(name))
        mine = tenants.setdefault(name, {})
        last = next(reversed(mine), None)
        mine[entry.ticket] = entry
        if last is not None and last > entry.ticket:
            tenants[name] = dict(sorted(mine.items()))
        self._entries[entry.ticket] = entry
        if entry.promised_due_s is not None:
            self._heads.setdefault(entry.rank, {})[entry.ticket] = entry
        self._kv_tokens += entry.kv_tokens
        self._prompt_tokens += entry.request.cost.prompt_tokens
        self._add_sums(entry, +1)
        heapq.heappush(self._deadlines, (entry.expires_at_s, entry.ticket))

    def remove(self, ticket: int) -> QueuedRequest | None:
        entry = self._entries.pop(ticket, None)
        if entry is None:
            return None
        if entry.promised_due_s is not None:
            heads = self._heads[entry.rank]
            del heads[ticket]
            if not heads:
                del self._heads[entry.rank]
        tenants = self._classes[entry.rank]
        name = entry.request.tenant.name
        del tenants[name][ticket]
        if not tenants[name]:
            del tenants[name]
            if not tenants:
                del self._classes[entry.rank]
        self._kv_tokens -= entry.kv_tokens
        self._prompt_tokens -= entry.request.cost.prompt_tokens
        self._add_sums(entry, -1)
        if not self._entries:
            self._deadlines.clear()
        return entry

    def _add_sums(self, entry: QueuedRequest, sign: int) -> None:
        key = (entry.rank, entry.request.tenant.name)
        models = self._sums.setdefault(key, {})
        cost = entry.request.cost
        sums = models.setdefault(cost.model, [0, 0, 0, 0])
        for i, value in enumerate((1, cost.kv_tokens, cost.prompt_tokens, cost.max_output_tokens)):
            sums[i] += sign * value
        if sums[0] == 0:
            del models[cost.model]
            if not models:
                del self._sums[key]

    def has_work_at_or_above(self, rank: int) -> bool:
        """Is anything queued with the same or a higher priority (a lower or equal rank)?"""
        return bool(self._classes) and min(self._classes) <= rank

    def ahead_of_claimant(self, rank: int, model: str) -> Ahead:
        """Work for ``model`` dispatched before a claimant of class ``rank``: higher classes and the
        claimants already queued in its own."""
        requests = kv = prompt = output = 0.0
        for (r, _), models in self._sums.items():
            sums = models.get(model)
            if sums is not None and r < rank:
                requests += sums[0]
                kv += sums[1]
                prompt += sums[2]
                output += sums[3]
        for entry in self._heads.get(rank, {}).values():
            cost = entry.request.cost
            if cost.model == model:
                requests += 1
                kv += cost.kv_tokens
                prompt += cost.prompt_tokens
                output += cost.max_output_tokens
        return Ahead(requests, kv, prompt, output)

    def ahead(self, tenant: Tenant, rank: int, model: str) -> Ahead:
        """Work for ``model`` that the queue order would dispatch before a new request of ``tenant``.

        Higher classes go first entirely, the tenant's own queued requests too (arrival order); of
        another tenant in the same class, what it is served before the tenant's virtual counter
        reaches the new request's start: ``(start - its counter) * its weight`` tokens, at most
        all it has queued.
        """
        requests = kv = prompt = output = 0.0
        own_kv = sum(sums[1] for sums in self._sums.get((rank, tenant.name), {}).values())
        start = max(self._counters.get(tenant.name, 0.0), self._floor(tenant.name)) + own_kv / tenant.weight
        for (r, name), models in self._sums.items():
            sums = models.get(model)
            if sums is None or r > rank:
                continue
            fraction = 1.0
            if r == rank and name != tenant.name:
                weight = self._entry_weight(r, name)
                total_kv = sum(m[1] for m in models.values())
                served = (start - self._counters.get(name, 0.0)) * weight
                fraction = min(1.0, max(0.0, served / total_kv)) if total_kv else 0.0
            requests += fraction * sums[0]
            kv += fraction * sums[1]
            prompt += fraction * sums[2]
            output += fraction * sums[3]
        return Ahead(requests, kv, prompt, output)

    def _floor(self, tenant_name: str) -> float:
        """Where the tenant's counter would be lifted to if it became active now."""
        if any(tenant_name in t for t in self._classes.values()):
            return 0.0
        waiting = [self._counters.get(n, 0.0) for t in self._classes.values() for n in t]
        return min(waiting) if waiting else self._virtual_time

    def _entry_weight(self, rank: int, tenant_name: str) -> float:
        entries = self._classes[rank][tenant_name]
        return next(iter(entries.values())).request.tenant.weight

    def charge(self, tenant_name: str, weight: float, kv_tokens: int) -> None:
        """Count ``kv_tokens`` of service against the tenant's virtual counter."""
        before = self._counters.get(tenant_name, 0.0)
        self._virtual_time = max(self._virtual_time, before)
        self._counters[tenant_name] = before + kv_tokens / weight

    def refund(self, tenant_name: str, weight: float, kv_tokens: int) -> None:
        self._counters[tenant_name] = self._counters.get(tenant_name, 0.0) - kv_tokens / weight

    def counter(self, tenant_name: str) -> float:
        return self._counters.get(tenant_name, 0.0)

    def expire(self, now_s: float) -> list[QueuedRequest]:
        expired: list[QueuedRequest] = []
        while self._deadlines and self._deadlines[0][0] <= now_s:
            _, ticket = heapq.heappop(self._deadlines)
            entry = self.remove(ticket)
            if entry is not None:
                expired.append(entry)
        return expired

    def walk(self, now_s: float, place: Place, stop_at: int | None = None) -> Walk:
        """Visit entries in dispatch order, placing what fits (nothing is removed or charged).

        Stops at ``stop_at`` once visited, at an aged entry that does not fit (capacity is held for
        it) and when ``place`` reports the fleet full.
        """
        placed: list[tuple[QueuedRequest, tuple[ReplicaView, ...]]] = []
        for entry in self._order(placed):
            candidates = place(entry)
            if candidates is None:
                break
            if candidates:
                placed.append((entry, candidates))
            elif now_s - entry.enqueued_at_s >= self.hold_after_s:
                return Walk(placed, entry)
            if entry.ticket == stop_at:
                break
        return Walk(placed, None)

    def _order(self, placed: list[tuple[QueuedRequest, tuple[ReplicaView, ...]]]) -> Iterator[QueuedRequest]:
        """Dispatch order. Counters advance, for this walk only, as entries in ``placed`` are placed."""
        counters = dict(self._counters)
        for rank in sorted(self._classes):
            claimants = self._heads.get(rank)
            if claimants:
                for entry in sorted(claimants.values(), key=_slot):
                    seen = len(placed)
                    yield entry
                    if len(placed) > seen:
                        name = entry.request.tenant.name
                        counters[name] = (
                            counters.get(name, 0.0) + entry.kv_tokens / entry.request.tenant.weight
                        )
            cursors = {
                name: (e for e in entries.values() if e.promised_due_s is None)
                if claimants
                else iter(entries.values())
                for name, entries in self._classes[rank].items()
            }
            heads: list[tuple[float, int, str, QueuedRequest]] = []
            for name, cursor in cursors.items():
                first = next(cursor, None)
                if first is not None:
                    heads.append((counters.get(name, 0.0), first.ticket, name, first))
            heapq.heapify(heads)
            while heads:
                _, _, name, entry = heapq.heappop(heads)
                seen = len(placed)
                yield entry
                if len(placed) > seen:
                    tenant = entry.request.tenant
                    counters[name] = counters.get(name, 0.0) + entry.kv_tokens / tenant.weight
                following = next(cursors[name], None)
                if following is not None:
                    heapq.heappush(heads, (counters.get(name, 0.0), following.ticket, name, following))

    def entries(self) -> list[QueuedRequest]:
        return list(self._entries.values())

    def stats(self, now_s: float) -> QueueStats:
        oldest = min((e.enqueued_at_s for e in self._entries.values()), default=now_s)
        return QueueStats(len(self._entries), self._kv_tokens, self._prompt_tokens, now_s - oldest)


def _slot(entry: QueuedRequest) -> tuple[float, int]:
    return (entry.promised_due_s or 0.0, entry.ticket)
