"""Whether a request goes now, waits, or is turned away, and which queued requests go when room frees.

Admission decides *whether*; routing decides *where*. ``admit`` answers ``Admit`` with every
routable replica that has KV room for the request's worst case and a slot under the
inter-token-latency guard for each of its sequences (``kvgate.vocabulary.capacity.fits``; the guard is
the configured limit, or the limit learned against the model's ITL objective when lower,
``kvgate.admission.itl_guard``), ``Queue`` when
the expected wait fits the request's budget (``kvgate.admission.deadline``: the queue's limit, the client's
timeout, the model's TTFT objective less its prefill), and a ``Refusal`` otherwise
(``kvgate.admission.refusals``): 429 with a Retry-After for overload, 503 when no replica can serve the
model, 400 when no replica could ever hold the request. A newcomer never takes capacity that queued
work of the same or higher priority would get first: it is admitted only if the walk over the
queue's order, on a simulated copy of the fleet (``kvgate.admission.placement``), reaches it with room to
spare. A refusal for capacity is also a promise (``kvgate.admission.promises``): a booked slot behind queued
and promised work that the request, coming back on time, claims at the head of its class. With
nothing queued and no promise due, the decision is one pass over the replicas.

Every path is synchronous and reads the fleet from one ``FleetSnapshot``; the edge performs the
effects, and ``AdmissionPump`` (``kvgate.admission.pump``) drives the queue side: ``on_capacity_freed``
after each release or fleet change, ``expire`` on a timer, ``cancel`` when a queued client leaves.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

from kvgate.admission import refusals
from kvgate.admission.calibration import Calibration
from kvgate.admission.deadline import WaitBound, ttft_objective_s, wait_budget
from kvgate.admission.decision import (
    AdmissionRequest,
    Admit,
    Decision,
    Dispatch,
    Expired,
    Queue,
    Refusal,
    RefusalReason,
)
from kvgate.admission.disaggregation import handoff_candidates
from kvgate.admission.forecast import ForecastMargin, WaitForecast
from kvgate.admission.itl_guard import ItlGuard, active_limit, measured_itl_s, sequence_limit
from kvgate.admission.ledger import Ledger
from kvgate.admission.placement import after_promises, fleet_placer
from kvgate.admission.pressure import ArrivalPressure
from kvgate.admission.promises import Promise, PromiseBook, PromiseCounts, work_ahead
from kvgate.admission.queue import Ahead, Place, QueuedRequest, QueueStats, WaitQueue
from kvgate.admission.retry_after import ServiceRates
from kvgate.admission.tenants import TenantDirectory
from kvgate.config.admission import AdmissionConfig
from kvgate.config.auth import AuthConfig
from kvgate.vocabulary.capacity import fits_sharing, kv_room_tokens, routable
from kvgate.vocabulary.replica import ReplicaView
from kvgate.vocabulary.snapshot import FleetSnapshot

FULL_FLEET_REASONS = frozenset(
    {RefusalReason.KV_CAPACITY, RefusalReason.QUEUE_FULL, RefusalReason.DEADLINE, RefusalReason.TTFT_SLO}
)
"""Refusals that say the fleet is full (not a budget, a bad request or no replica at all). A queued
request does not: the fleet may be taking all that arrives, a little later."""


class AdmissionController:
    def __init__(
        self,
        config: AdmissionConfig,
        ledger: Ledger,
        tenants: TenantDirectory | None = None,
        calibration: Calibration | None = None,
    ) -> None:
        self.config = config
        self.tenants = tenants if tenants is not None else TenantDirectory(config, AuthConfig())
        self.calibration = calibration if calibration is not None else Calibration()
        self._queue = WaitQueue(
            config.queue_max_requests, config.queue_max_tokens, config.head_of_line_max_wait_s
        )
        self._tickets = itertools.count(1)
        self._claimed: Promise | None = None
        """Set by ``_admit`` to the promise the request claimed: ``admit`` counts the outcome."""
        self._claimed_room_at_s: float | None = None
        """When the claimed promise's room was first held for it (``PromiseBook.room_at_s``)."""
        self._promises = PromiseBook(config.promise_grace_s)
        self._returning = False
        """Set by ``_admit`` when the request came back to a promise: not new demand."""
        self._margin = ForecastMargin()
        """What the queue-wait forecast has missed by lately (``kvgate.admission.forecast``)."""
        self._forecast_s: dict[int, float] = {}
        """The wait forecast for each queued ticket, to learn ``_margin`` from when it leaves."""
        self._pressure = ArrivalPressure()
        """New demand against what the fleet admits while saturated (``kvgate.admission.pressure``)."""
        self.itl_guard = ItlGuard.from_config(config)
        """The learned inter-token-latency limits, None when no model has an ``itl_slo_s``."""
        self._forecast = WaitForecast(
            ledger,
            self.calibration,
            ServiceRates(config.default_inter_token_s, config.default_prefill_tokens_per_s),
            self.max_active,
            functools.partial(measured_itl_s, self.itl_guard),
        )

    @property
    def rates(self) -> ServiceRates:
        return self._forecast.rates

    def observe_rates(self, rates: ServiceRates) -> None:
        """Feed smoothed inter-token latency and prefill rate (from the edge's measurements)."""
        self._forecast.rates = rates

    @property
    def promise_counts(self) -> PromiseCounts:
        return self._promises.counts

    @property
    def promises(self) -> PromiseBook:
        """The promise book, which the edge shares with the other gateways (``PromiseBook.learn``)."""
        return self._promises

    def admit(self, request: AdmissionRequest, fleet: FleetSnapshot) -> Decision:
        """Admit, queue or refuse ``request`` over ``fleet``; a promise it came back to claim is
        counted kept or broken by the answer."""
        self._claimed, self._returning = None, False
        decision = self._admit(request, fleet)
        now_s, kv_tokens = fleet.now_s, request.cost.kv_tokens
        if not self._returning:
            self._pressure.arrived(kv_tokens, now_s)
        if isinstance(decision, Admit):
            self._pressure.admitted(kv_tokens, now_s)
        elif isinstance(decision, Refusal) and decision.reason in FULL_FLEET_REASONS:
            self._pressure.saturated(now_s)
        if self._claimed is not None:
            self._promises.counts.claimed(self._claimed, decision, now_s, self._claimed_room_at_s)
        return decision

    def _admit(self, request: AdmissionRequest, fleet: FleetSnapshot) -> Decision:
        now_s = fleet.now_s
        self._promises.expire(now_s)
        cost = request.cost
        kv_tokens = cost.kv_tokens
        sequences = cost.sequences
        model = cost.model
        blocks, resident = request.prompt_blocks, fleet.resident
        serving: list[ReplicaView] = []
        fitting: list[ReplicaView] = []
        largest = 0
        most_slots = 0
        for v in fleet.replicas:
            if not routable(v, model, now_s):
                continue
            serving.append(v)
            if v.kv_capacity_tokens > largest:
                largest = v.kv_capacity_tokens
            slots = self.max_active(v)
            if slots > most_slots:
                most_slots = slots
            if fits_sharing(v, kv_tokens, sequences, slots, blocks, resident, cost.prompt_tokens):
                fitting.append(v)
        if not serving:
            return refusals.none_serving(model, fleet, self.config)
        if kv_tokens > largest:
            return refusals.too_large(cost, largest)
        if sequences > most_slots:
            return refusals.too_many_sequences(cost, most_slots)
        tenant = request.tenant
        rank = tenant.priority.rank
        promise = self._promises.returning(request)
        self._returning = promise is not None
        if promise is not None and now_s < promise.due_s - self._promises.grace_s:
            free_now = (
                fitting
                and not self._queue.has_work_at_or_above(rank)
                and not self._promises.has_due(now_s, rank)
            )
            if not free_now:
                return refusals.place_held(model, promise.due_s - now_s, self.config)
        budget_wait_s = self.tenants.take(tenant, kv_tokens, now_s)
        if budget_wait_s > 0.0:
            return refusals.over_budget(tenant, kv_tokens, budget_wait_s, self.config)
        if promise is not None:
            self._claimed_room_at_s = self._promises.room_at_s(promise)
            self._promises.remove(promise)
            self._claimed = promise
        ticket = next(self._tickets)
        if fitting and not self._queue.has_work_at_or_above(rank) and not self._promises.has_due(now_s, rank):
            if len(fitting) > 1:
                # Most room first; a stable sort keeps replicas with equal room in fleet order.
                fitting.sort(key=kv_room_tokens, reverse=True)
            self._queue.charge(tenant.name, tenant.weight, kv_tokens)
            return Admit(tuple(fitting))
        wait_budget_s, bound = self._wait_budget(request)
        entry = QueuedRequest(
            ticket, request, now_s, now_s + wait_budget_s, None if promise is None else promise.due_s
        )
        if fitting:
            candidates = self._place_in_order(entry, fleet)
            if candidates:
                self._queue.charge(tenant.name, tenant.weight, kv_tokens)
                return Admit(candidates)
        expected_s = self._forecast.expected_wait_s(kv_tokens, model, self._ahead(entry), serving)
        queue_has_room = self._has_room(kv_tokens)
        # Served past its TTFT objective it would not count: only what the forecast has missed by
        # lately still leaves it in time.
        margin_s = self._margin.margin_s if bound is WaitBound.TTFT_SLO else 0.0
        if queue_has_room and expected_s + margin_s <= wait_budget_s:
            self._queue.push(entry)
            self._forecast_s[entry.ticket] = expected_s
            return Queue(entry.ticket, expected_s, entry.expires_at_s)
        self.tenants.refund(request.tenant, kv_tokens)
        if not queue_has_room:
            return refusals.queue_full(self.queue_stats(now_s), expected_s, self.config)
        expected_s, promised = self._promise(request, expected_s, fleet)
        return refusals.overload(model, expected_s, wait_budget_s, bound, self.config, promised)

    def retry_candidates(self, request: AdmissionRequest, fleet: FleetSnapshot) -> tuple[ReplicaView, ...]:
        """Where a request admitted once may be retried now (its replica failed before the first
        byte): replicas with room for its worst case and a slot per sequence under the same guard
        ``admit`` applies, most room first. A retry already had its turn, so it skips the queue,
        but never the guard: none fitting means no retry."""
        cost = request.cost
        fitting = [
            v
            for v in fleet.replicas
            if routable(v, cost.model, fleet.now_s)
            and fits_sharing(
                v,
                cost.kv_tokens,
                cost.sequences,
                self.max_active(v),
                request.prompt_blocks,
                fleet.resident,
                cost.prompt_tokens,
            )
        ]
        fitting.sort(key=kv_room_tokens, reverse=True)
        return tuple(fitting)

    def decode_room(
        self, request: AdmissionRequest, fleet: FleetSnapshot
    ) -> tuple[ReplicaView, ...] | Refusal:
        """The decode replicas a disaggregated request fits on now (``kvgate.admission.disaggregation``), or
        why none: a Retry-After from the decode pool's own drain when it is the bottleneck."""
        cost = request.cost
        serving, fitting = handoff_candidates(cost, fleet, self.max_active)
        if fitting:
            return tuple(fitting)
        if not serving:
            return refusals.none_serving(cost.model, fleet, self.config)
        largest = max(v.kv_capacity_tokens for v in serving)
        if cost.kv_tokens > largest:
            return refusals.too_large(cost, largest)
        expected_s = self._forecast.expected_wait_s(cost.kv_tokens, cost.model, Ahead(), serving)
        return refusals.decode_full(cost.model, expected_s, self.config)

    def on_capacity_freed(self, fleet: FleetSnapshot) -> list[Dispatch]:
        """Queued requests that fit now, in queue order, removed from the queue.

        Each dispatch's candidates assume the ones before it were placed on their first candidate;
        the edge routes and reserves them in order, and hands a dispatch that no longer fits any
        replica back with ``requeue``.
        """
        if not len(self._queue):
            return []
        now_s = fleet.now_s
        walk = self._queue.walk(now_s, self._placer(fleet))
        dispatches: list[Dispatch] = []
        for entry, candidates in walk.placed:
            self._queue.remove(entry.ticket)
            tenant = entry.request.tenant
            self._queue.charge(tenant.name, tenant.weight, entry.kv_tokens)
            self._pressure.admitted(entry.kv_tokens, now_s)
            if entry.promised_due_s is not None:
                self._promises.counts.kept += 1
                self._promises.counts.errors.observe(now_s - entry.promised_due_s)
            self._learn_margin(entry, now_s)
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
        if dispatch.promised_due_s is not None:
            self._promises.counts.kept -= 1  # counted again when it leaves the queue for good
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

    def expire(self, fleet: FleetSnapshot) -> list[Expired]:
        """Queued requests whose wait budget ran out: each with the 429 to answer it with."""
        now_s = fleet.now_s
        self._promises.expire(now_s)
        expired: list[Expired] = []
        for entry in self._queue.expire(now_s):
            request = entry.request
            self.tenants.refund(request.tenant, entry.kv_tokens)
            self._learn_margin(entry, now_s)
            serving = [v for v in fleet.replicas if routable(v, request.model, now_s)]
            promised = False
            if serving:
                self._pressure.saturated(now_s)
                expected_s = self._forecast.expected_wait_s(
                    entry.kv_tokens, request.model, self._ahead(entry), serving
                )
                if entry.promised_due_s is not None:
                    self._promises.counts.broken += 1
                    self._promises.counts.errors.observe(now_s + expected_s - entry.promised_due_s)
                expected_s, promised = self._promise(request, expected_s, fleet)
            else:
                expected_s = self.config.no_replica_retry_after_s
            budget_s, bound = self._wait_budget(request)
            refusal = refusals.overload(request.model, expected_s, budget_s, bound, self.config, promised)
            expired.append(Expired(entry.ticket, request, refusal))
        return expired

    def cancel(self, ticket: int) -> bool:
        """The queued client left: drop its request at once. False if it was not queued."""
        entry = self._queue.remove(ticket)
        if entry is None:
            return False
        self._forecast_s.pop(ticket, None)
        self.tenants.refund(entry.request.tenant, entry.kv_tokens)
        return True

    def unadmit(self, request: AdmissionRequest) -> None:
        """An admitted request that no replica took after all (the fleet changed between the
        decision and the routing): give back its tenant's budget and its fair-share charge."""
        kv_tokens = request.cost.kv_tokens
        self.tenants.refund(request.tenant, kv_tokens)
        self._queue.refund(request.tenant.name, request.tenant.weight, kv_tokens)

    def defer(self, request: AdmissionRequest, now_s: float) -> Queue:
        """An admitted request that routing would rather keep waiting (the replica caching its
        prompt's prefix is full, ``routing.prefix_hold_s``): it joins the queue as if it had found
        no room, with its own wait budget; its fair-share charge waits for its dispatch, its tenant
        budget stays taken, as for any queued request."""
        kv_tokens = request.cost.kv_tokens
        self._queue.refund(request.tenant.name, request.tenant.weight, kv_tokens)
        wait_budget_s, _ = self._wait_budget(request)
        entry = QueuedRequest(next(self._tickets), request, now_s, now_s + wait_budget_s, None)
        self._queue.push(entry)
        return Queue(entry.ticket, 0.0, entry.expires_at_s)

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

    def unmet(self, now_s: float) -> tuple[int, int]:
        """Demand the fleet did not take: KV tokens and requests queued or refused with a promise
        still open (``kvgate.admission.claims`` sizes a gateway's claims on it)."""
        self._promises.expire(now_s)
        queued = self._queue.stats(now_s)
        return queued.kv_tokens + self._promises.kv_tokens, queued.requests + len(self._promises)

    def _promise(
        self, request: AdmissionRequest, expected_s: float, fleet: FleetSnapshot
    ) -> tuple[float, bool]:
        """Book the refused request a slot when the queue's bounds and the promises' share of the
        fleet leave room for it, and return its Retry-After and whether it was booked. The time is
        the drain estimate (or, for a request with a TTFT objective, the time spare capacity serves
        it without refusing a newcomer, ``kvgate.admission.pressure``), pushed back to the first
        slot whose room the share can hold beside the promises due with it
        (``PromiseBook.slot_s``). A time behind which no room is held is no promise: the client is
        told not to retry."""
        now_s = fleet.now_s
        if ttft_objective_s(request, self.config) is not None:
            expected_s = self._pressure.stretch(expected_s, now_s)
        if not self._has_room(request.cost.kv_tokens):
            return expected_s, False
        booked_s = self._promises.offer(
            request, expected_s, now_s, self.config.retry_after_cap_s, self._share_tokens(fleet)
        )
        return (expected_s, False) if booked_s is None else (booked_s, True)

    def _learn_margin(self, entry: QueuedRequest, now_s: float) -> None:
        """A queued request left (dispatched, or its place ran out: then it waited at least this
        long): how far its wait was from the forecast."""
        forecast_s = self._forecast_s.pop(entry.ticket, None)
        if forecast_s is not None:
            self._margin.observe(now_s - entry.enqueued_at_s - forecast_s)

    def _share_tokens(self, fleet: FleetSnapshot) -> float:
        """The most KV the open promises may hold at once: ``promise_max_share`` of the fleet."""
        return self.config.promise_max_share * sum(v.kv_capacity_tokens for v in fleet.replicas)

    def _has_room(self, kv_tokens: int) -> bool:
        return self._queue.has_room(kv_tokens, len(self._promises), self._promises.kv_tokens)

    def _ahead(self, entry: QueuedRequest) -> Ahead:
        """Queued and promised work dispatched before ``entry``."""
        return work_ahead(self._queue, self._promises, entry)

    def _place_in_order(self, entry: QueuedRequest, fleet: FleetSnapshot) -> tuple[ReplicaView, ...] | None:
        """Where ``entry`` goes if admitted now after everything that would go before it."""
        place = self._placer(fleet)
        if not self._queue.has_work_at_or_above(entry.rank):
            return place(entry) or None
        self._queue.push(entry)
        walk = self._queue.walk(fleet.now_s, place, stop_at=entry.ticket)
        self._queue.remove(entry.ticket)
        for placed, candidates in walk.placed:
            if placed.ticket == entry.ticket:
                return candidates
        return None

    def _placer(self, fleet: FleetSnapshot) -> Place:
        now_s, book = fleet.now_s, self._promises
        place = fleet_placer(fleet.replicas, now_s, self.max_active, fleet.resident)
        return after_promises(
            place, book.due(now_s), self._share_tokens(fleet), lambda promise: book.held(promise, now_s)
        )

    def _wait_budget(self, request: AdmissionRequest) -> tuple[float, WaitBound]:
        return wait_budget(request, self.config, self.rates.prefill_tokens_per_s)

    def max_active(self, view: ReplicaView) -> int:
        """The sequences admission lets ``view`` run (``kvgate.admission.itl_guard.active_limit``)."""
        return active_limit(self.config.max_active_sequences_per_replica, self.itl_guard, view)

    def guard_sequences(self, replica_id: str) -> int:
        """The inter-token-latency guard of one replica (``kvgate.admission.itl_guard``)."""
        return sequence_limit(self.config.max_active_sequences_per_replica, self.itl_guard, replica_id)
