"""Whether a request goes now, waits, or is turned away, and which queued requests go when room frees.

Admission decides *whether*; routing decides *where*. ``decide`` answers ``Admit`` with every
routable replica that has KV room for the request's worst case and a slot under the
inter-token-latency guard for each of its sequences (the one ``capacity.fits`` question), ``Queue``
when the expected wait fits the request's budget (``max_queue_wait_s``, or the client's own timeout
when shorter), and ``Reject`` otherwise: 429 with a Retry-After for overload (KV capacity, a full
queue, a tenant's budget, a deadline the wait would miss), 503 when no replica can serve the model
at all, 400 when no replica could ever hold the request (its worst-case KV, or a slot under the
guard for each of its sequences). A newcomer never takes capacity that queued work of the same or
higher priority would get first: it is placed in the queue's order and admitted only if the walk
over that order, on a simulated copy of the fleet, reaches it with room to spare. A refusal for
capacity is also a promise (``admission.promises``): its Retry-After is a booked slot behind queued
and promised work, due promises count as work ahead of the same and lower classes, and the request
coming back on time claims the slot at the head of its class. With nothing queued and no promise
due, the decision is one pass over the replicas.

Every path is synchronous and takes ``now_s``; the edge performs the effects (reserve, wait on a
ticket, answer) and calls ``on_capacity_freed`` after each release or fleet change, ``expire`` on a
timer and ``cancel`` when a queued client disconnects.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from admission.calibration import Calibration
from admission.decision import (
    AdmissionRequest,
    Admit,
    Decision,
    Dispatch,
    Expired,
    Queue,
    Reject,
    RejectReason,
)
from admission.ledger import Ledger
from admission.promises import Promise, PromiseBook, fingerprint
from admission.queue import Ahead, Place, QueuedRequest, QueueStats, WaitQueue
from admission.retry_after import (
    Backlog,
    FleetDrain,
    ReplicaDrain,
    ResidentWork,
    ServiceRates,
    completions_s,
    drain_wait_s,
    retry_after,
)
from admission.tenants import TenantDirectory
from config.admission import AdmissionConfig
from vocabulary.capacity import fits, kv_room_tokens
from vocabulary.replica import ReplicaView, Role


class AdmissionController:
    def __init__(
        self,
        config: AdmissionConfig,
        ledger: Ledger,
        tenants: TenantDirectory | None = None,
        calibration: Calibration | None = None,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.tenants = tenants if tenants is not None else TenantDirectory(config)
        self.calibration = calibration if calibration is not None else Calibration()
        self.rates = ServiceRates(config.default_inter_token_s, config.default_prefill_tokens_per_s)
        self._queue = WaitQueue(
            config.queue_max_requests, config.queue_max_tokens, config.head_of_line_max_wait_s
        )
        self._next_ticket = 1
        self._promises = PromiseBook(config.promise_grace_s)
        self._last_replicas: Sequence[ReplicaView] = ()
        self._drains: dict[str, tuple[tuple[object, ...], ReplicaDrain]] = {}
        self._fleet_drain: FleetDrain | None = None

    def observe_rates(self, rates: ServiceRates) -> None:
        """Feed smoothed inter-token latency and prefill rate (from the edge's measurements)."""
        self.rates = rates

    def decide(self, request: AdmissionRequest, replicas: Sequence[ReplicaView], now_s: float) -> Decision:
        self._last_replicas = replicas
        self._promises.expire(now_s)
        cost = request.cost
        kv_tokens = cost.kv_tokens
        sequences = cost.sequences
        model = cost.model
        serving: list[ReplicaView] = []
        fitting: list[ReplicaView] = []
        largest = 0
        most_slots = 0
        for v in replicas:
            if not _routable(v, model, now_s):
                continue
            serving.append(v)
            if v.capacity_kv_tokens > largest:
                largest = v.capacity_kv_tokens
            slots = self._max_active(v)
            if slots > most_slots:
                most_slots = slots
            if fits(v, kv_tokens, sequences, slots):
                fitting.append(v)
        if not serving:
            return self._no_replica(model, replicas, now_s)
        if kv_tokens > largest:
            return Reject(
                400,
                RejectReason.KV_CAPACITY,
                f"This request needs {kv_tokens} tokens of KV cache ({cost.prompt_tokens} prompt + "
                f"{cost.max_output_tokens} max output) but the largest replica serving '{model}' "
                f"holds {largest}. Reduce the prompt or max_tokens.",
                param="max_tokens",
            )
        if sequences > most_slots:
            return Reject(
                400,
                RejectReason.KV_CAPACITY,
                f"This request runs {sequences} sequences at once but a replica serving '{model}' runs "
                f"at most {most_slots} (the inter-token-latency guard), so it could never be admitted. "
                "Reduce n or the number of prompts.",
                param="n",
            )
        tenant = request.tenant
        rank = tenant.priority.rank
        promise = self._returning(request)
        if promise is not None and now_s < promise.due_s - self._promises.grace_s:
            free_now = (
                fitting
                and not self._queue.has_work_at_or_above(rank)
                and not self._promises.has_due(now_s, rank)
            )
            if not free_now:
                return self._early(request, promise, now_s)
        budget_wait_s = self.tenants.take(tenant, kv_tokens, now_s)
        if budget_wait_s > 0.0:
            hint = retry_after(budget_wait_s, self.config.retry_after_cap_s)
            return Reject(
                429,
                RejectReason.TENANT_BUDGET,
                f"Tenant '{tenant.name}' is over its budget of {tenant.tokens_per_min} "
                f"tokens per minute; this request counts {kv_tokens} (prompt + max output). "
                f"Retry after {hint.seconds} s.",
                hint,
            )
        if promise is not None:
            self._promises.remove(promise)
        ticket = self._take_ticket()
        if fitting and not self._queue.has_work_at_or_above(rank) and not self._promises.has_due(now_s, rank):
            if len(fitting) > 1:
                # Most room first; a stable sort keeps replicas with equal room in fleet order.
                fitting.sort(key=kv_room_tokens, reverse=True)
            self._queue.charge(tenant.name, tenant.weight, kv_tokens)
            return Admit(tuple(fitting))
        wait_budget_s, client_bound = self._wait_budget(request)
        entry = QueuedRequest(
            ticket, request, now_s, now_s + wait_budget_s, None if promise is None else promise.due_s
        )
        if fitting:
            candidates = self._place_in_order(entry, replicas, now_s)
            if candidates:
                self._queue.charge(tenant.name, tenant.weight, kv_tokens)
                return Admit(candidates)
        expected_s = self._expected_wait_s(kv_tokens, model, self._ahead(entry), serving)
        queue_has_room = self._has_room(kv_tokens)
        if queue_has_room and expected_s <= wait_budget_s:
            self._queue.push(entry)
            return Queue(entry.ticket, expected_s, entry.expires_at_s)
        self.tenants.refund(request.tenant, kv_tokens)
        if not queue_has_room:
            hint = retry_after(expected_s, self.config.retry_after_cap_s)
            stats = self._queue.stats(now_s)
            return Reject(
                429,
                RejectReason.QUEUE_FULL,
                f"The admission queue is full ({stats.requests} requests, {stats.kv_tokens} tokens queued, "
                f"{len(self._promises)} promised). Retry after {hint.seconds} s.",
                hint,
            )
        self._promise(request, expected_s, now_s)
        return self._overload(request, expected_s, wait_budget_s, client_bound)

    def retry_candidates(
        self, request: AdmissionRequest, replicas: Sequence[ReplicaView], now_s: float
    ) -> tuple[ReplicaView, ...]:
        """Where a request admitted once may be retried now (its replica failed before the first
        byte): replicas with room for its worst case and a slot per sequence under the same guard
        ``decide`` applies, most room first. A retry already had its turn, so it skips the queue,
        but never the guard: none fitting means no retry."""
        cost = request.cost
        fitting = [
            v
            for v in replicas
            if _routable(v, cost.model, now_s)
            and fits(v, cost.kv_tokens, cost.sequences, self._max_active(v))
        ]
        fitting.sort(key=kv_room_tokens, reverse=True)
        return tuple(fitting)

    def on_capacity_freed(self, replicas: Sequence[ReplicaView], now_s: float) -> list[Dispatch]:
        """Queued requests that fit now, in queue order, removed from the queue.

        Each dispatch's candidates assume the ones before it were placed on their first candidate;
        the edge routes and reserves them in order, and hands a dispatch that no longer fits any
        replica back with ``requeue``.
        """
        self._last_replicas = replicas
        if not len(self._queue):
            return []
        walk = self._queue.walk(now_s, self._placer(replicas, now_s))
        dispatches: list[Dispatch] = []
        for entry, candidates in walk.placed:
            self._queue.remove(entry.ticket)
            tenant = entry.request.tenant
            self._queue.charge(tenant.name, tenant.weight, entry.kv_tokens)
            dispatches.append(
                Dispatch(
                    entry.ticket,
                    entry.request,
                    candidates,
                    entry.enqueued_at_s,
                    entry.expires_at_s,
                    now_s - entry.enqueued_at_s,
                    entry.promised_due_s,
                )
            )
        return dispatches

    def requeue(self, dispatch: Dispatch) -> None:
        """Put a dispatch that could not be placed back in its original place."""
        tenant = dispatch.request.tenant
        self._queue.refund(tenant.name, tenant.weight, dispatch.request.cost.kv_tokens)
        self._queue.push(
            QueuedRequest(
                dispatch.ticket,
                dispatch.request,
                dispatch.enqueued_at_s,
                dispatch.expires_at_s,
                dispatch.promised_due_s,
            )
        )

    def expire(self, now_s: float, replicas: Sequence[ReplicaView] | None = None) -> list[Expired]:
        """Queued requests whose wait budget ran out: each with the 429 to answer it with."""
        if replicas is not None:
            self._last_replicas = replicas
        self._promises.expire(now_s)
        expired: list[Expired] = []
        for entry in self._queue.expire(now_s):
            request = entry.request
            self.tenants.refund(request.tenant, entry.kv_tokens)
            serving = [v for v in self._last_replicas if _routable(v, request.model, now_s)]
            if serving:
                expected_s = self._expected_wait_s(
                    entry.kv_tokens, request.model, self._ahead(entry), serving
                )
                self._promise(request, expected_s, now_s)
            else:
                expected_s = self.config.no_replica_retry_after_s
            budget_s, client_bound = self._wait_budget(request)
            reject = self._overload(request, expected_s, budget_s, client_bound)
            expired.append(Expired(entry.ticket, request, reject))
        return expired

    def cancel(self, ticket: int) -> bool:
        """The queued client left: drop its request at once. False if it was not queued."""
        entry = self._queue.remove(ticket)
        if entry is None:
            return False
        self.tenants.refund(entry.request.tenant, entry.kv_tokens)
        return True

    def settle(self, request: AdmissionRequest, used_tokens: int) -> None:
        """A request finished having used ``used_tokens`` (actual prompt + output): give back to the
        tenant's budget and fairness counter what its worst case over-charged."""
        unused = request.cost.kv_tokens - used_tokens
        if unused > 0:
            self.tenants.refund(request.tenant, unused)
            self._queue.refund(request.tenant.name, request.tenant.weight, unused)

    def queue_stats(self, now_s: float) -> QueueStats:
        """Queued work, and the promised slots still open at ``now_s`` (``promised_requests``)."""
        self._promises.expire(now_s)
        return dataclasses.replace(self._queue.stats(now_s), promised_requests=len(self._promises))

    def is_queued(self, ticket: int) -> bool:
        return ticket in self._queue

    def _returning(self, request: AdmissionRequest) -> Promise | None:
        """The promise this request comes back to claim, if any."""
        if request.body is None or not request.retry_count or not len(self._promises):
            return None
        return self._promises.find((request.tenant.name, fingerprint(request.body)))

    def _promise(self, request: AdmissionRequest, expected_s: float, now_s: float) -> None:
        """Book the refused request a slot at its Retry-After, if it can be recognised and the
        queue's bounds leave room. The promise keeps the request's tenant and cost, not its body."""
        if request.body is None or request.retry_count is None or not math.isfinite(expected_s):
            return
        if self._has_room(request.cost.kv_tokens):
            key = (request.tenant.name, fingerprint(request.body))
            self._promises.book(key, dataclasses.replace(request, body=None), now_s + expected_s)

    def _early(self, request: AdmissionRequest, promise: Promise, now_s: float) -> Reject:
        hint = retry_after(promise.due_s - now_s, self.config.retry_after_cap_s)
        return Reject(
            429,
            RejectReason.KV_CAPACITY,
            f"The servers for '{request.model}' are at KV-cache capacity; this request holds a place "
            f"due in {promise.due_s - now_s:.1f} s. Retry after {hint.seconds} s.",
            hint,
        )

    def _has_room(self, kv_tokens: int) -> bool:
        return self._queue.has_room(kv_tokens, len(self._promises), self._promises.kv_tokens)

    def _ahead(self, entry: QueuedRequest) -> Ahead:
        """Queued and promised work dispatched before ``entry``."""
        request = entry.request
        if entry.promised_due_s is None:
            queued = self._queue.ahead(request.tenant, entry.rank, request.model)
        else:
            queued = self._queue.ahead_of_claimant(entry.rank, request.model)
        promised = self._promises.ahead(entry.rank, request.model, entry.promised_due_s)
        return Ahead(
            queued.requests + promised.requests,
            queued.kv_tokens + promised.kv_tokens,
            queued.prompt_tokens + promised.prompt_tokens,
            queued.max_output_tokens + promised.max_output_tokens,
        )

    def _place_in_order(
        self, entry: QueuedRequest, replicas: Sequence[ReplicaView], now_s: float
    ) -> tuple[ReplicaView, ...] | None:
        """Where ``entry`` goes if admitted now after everything that would go before it."""
        place = self._placer(replicas, now_s)
        if not self._queue.has_work_at_or_above(entry.rank):
            return place(entry) or None
        self._queue.push(entry)
        walk = self._queue.walk(now_s, place, stop_at=entry.ticket)
        self._queue.remove(entry.ticket)
        for placed, candidates in walk.placed:
            if placed.ticket == entry.ticket:
                return candidates
        return None

    def _take_ticket(self) -> int:
        ticket = self._next_ticket
        self._next_ticket += 1
        return ticket

    def _wait_budget(self, request: AdmissionRequest) -> tuple[float, bool]:
        timeout_s = request.client_timeout_s
        if timeout_s is not None and timeout_s < self.config.max_queue_wait_s:
            return timeout_s, True
        return self.config.max_queue_wait_s, False

    def _max_active(self, view: ReplicaView) -> int:
        """The guard: the configured limit, or the replica's own sequence slots when fewer."""
        limit = self.config.max_active_sequences_per_replica
        return view.max_sequences if 0 < view.max_sequences < limit else limit

    def _placer(self, replicas: Sequence[ReplicaView], now_s: float) -> Place:
        """``_fleet_placer``, where each entry first sets aside room for the due promises that go
        before it: a higher class, or its own class with an earlier slot (or any, for a newcomer)."""
        place = self._fleet_placer(replicas, now_s)
        due = sorted(self._promises.due(now_s), key=lambda p: (p.rank, p.due_s))
        if not due:
            return place
        held = iter(due)
        pending = next(held, None)

        def place_after_promises(entry: QueuedRequest) -> tuple[ReplicaView, ...] | None:
            nonlocal pending
            claimed_due_s = entry.promised_due_s
            while pending is not None and (
                pending.rank < entry.rank
                or (pending.rank == entry.rank and (claimed_due_s is None or pending.due_s < claimed_due_s))
            ):
                place(QueuedRequest(0, pending.request, pending.due_s, pending.due_s))
                pending = next(held, None)
            return place(entry)

        return place_after_promises

    def _fleet_placer(self, replicas: Sequence[ReplicaView], now_s: float) -> Place:
        """Places entries on a simulated copy of the fleet, each on the candidate with most room
        (where least-loaded routing would most likely put it)."""
        originals = {v.replica_id: v for v in replicas}
        simulated = dict(originals)
        best_room: dict[str, int] = {}

        def place(entry: QueuedRequest) -> tuple[ReplicaView, ...] | None:
            if not any(
                v.load.resident_sequences < self._max_active(v) and kv_room_tokens(v) > 0
                for v in simulated.values()
            ):
                return None
            kv_tokens = entry.kv_tokens
            sequences = entry.request.cost.sequences
            model = entry.request.model
            if best_room.get(model, kv_tokens) < kv_tokens:
                return ()
            serving = [v for v in simulated.values() if _routable(v, model, now_s)]
            fitting = [v for v in serving if fits(v, kv_tokens, sequences, self._max_active(v))]
            if not fitting:
                best_room[model] = max(
                    (kv_room_tokens(v) for v in serving if v.load.resident_sequences < self._max_active(v)),
                    default=0,
                )
                return ()
            fitting.sort(key=kv_room_tokens, reverse=True)
            chosen = fitting[0]
            load = chosen.load
            cost = entry.request.cost
            simulated[chosen.replica_id] = dataclasses.replace(
                chosen,
                load=dataclasses.replace(
                    load,
                    prefill_tokens_pending=load.prefill_tokens_pending + cost.prompt_tokens,
                    resident_sequences=load.resident_sequences + sequences,
                    remaining_decode_tokens=load.remaining_decode_tokens + cost.max_output_tokens,
                    reserved_kv_tokens=load.reserved_kv_tokens + kv_tokens,
                ),
            )
            best_room.clear()
            return tuple(originals[v.replica_id] for v in fitting)

        return place

    def _expected_wait_s(
        self, kv_tokens: int, model: str, ahead: Ahead, serving: Sequence[ReplicaView]
    ) -> float:
        expected_output = (
            ahead.requests
            * self.calibration.expected_remaining_tokens(
                model, 0, round(ahead.max_output_tokens / ahead.requests)
            )
            if ahead.requests > 0
            else 0.0
        )
        backlog = Backlog(ahead.requests, ahead.kv_tokens, ahead.prompt_tokens, expected_output)
        drains = tuple(self._drain(v) for v in serving)
        if self._fleet_drain is None or self._fleet_drain.replicas != drains:
            self._fleet_drain = FleetDrain.of(drains)
        return drain_wait_s(kv_tokens, self._fleet_drain, backlog, self.rates)

    def _drain(self, view: ReplicaView) -> ReplicaDrain:
        """The replica's drain state, cached until its load, the rates or the learned lengths change."""
        key = (
            view.load,
            view.capacity_kv_tokens,
            self._max_active(view),
            self.rates,
            self.calibration.version,
        )
        cached = self._drains.get(view.replica_id)
        if cached is not None and cached[0] == key:
            return cached[1]
        resident = sorted(self.ledger.resident(view.replica_id), key=lambda held: held.reserved_at_s)
        work = [
            ResidentWork(
                held.kv_tokens,
                held.prefill_tokens_pending,
                self.calibration.expected_remaining_tokens(
                    held.cost.model, held.produced_tokens, held.cost.max_output_tokens
                ),
            )
            for held in resident
        ]
        drain = ReplicaDrain(
            view.replica_id,
            kv_room_tokens(view),
            view.capacity_kv_tokens,
            view.load.resident_sequences,
            self._max_active(view),
            completions_s(work, self.rates),
        )
        self._drains[view.replica_id] = (key, drain)
        return drain

    def _overload(
        self, request: AdmissionRequest, expected_s: float, budget_s: float, client_bound: bool
    ) -> Reject:
        hint = retry_after(expected_s, self.config.retry_after_cap_s)
        retry_s = hint.seconds
        wait = f"about {expected_s:.1f} s"
        if client_bound:
            message = (
                f"The expected wait for KV-cache capacity on '{request.model}' ({wait}) exceeds this "
                f"request's timeout of {budget_s:.1f} s. Retry after {retry_s} s."
            )
            reason = RejectReason.DEADLINE
        else:
            message = (
                f"The servers for '{request.model}' are at KV-cache capacity: the expected wait ({wait}) "
                f"exceeds the {budget_s:.1f} s queue limit. Retry after {retry_s} s."
            )
            reason = RejectReason.KV_CAPACITY
        return Reject(429, reason, message, hint)

    def _no_replica(self, model: str, replicas: Sequence[ReplicaView], now_s: float) -> Reject:
        back_s = [
            v.backoff_until_s - now_s
            for v in replicas
            if model in v.models and v.healthy and v.ready_since_s is not None and v.backoff_until_s > now_s
        ]
        wait_s = min(back_s) if back_s else self.config.no_replica_retry_after_s
        hint = retry_after(wait_s, self.config.retry_after_cap_s)
        return Reject(
            503,
            RejectReason.NO_REPLICA,
            f"No replica serving '{model}' is available. Retry after {hint.seconds} s.",
            hint,
        )


def _routable(view: ReplicaView, model: str, now_s: float) -> bool:
    return (
        view.healthy
        and view.ready_since_s is not None
        and view.backoff_until_s <= now_s
        and model in view.models
        and view.role is not Role.DECODE
    )
