"""Whether a request goes now, waits, or is turned away, and which queued requests go when room frees.

Admission decides *whether*; routing decides *where*. ``decide`` answers ``Admit`` with every
routable replica that has KV room for the request's worst case and a sequence slot under the
inter-token-latency guard (the one ``capacity.fits`` question), ``Queue`` when the expected wait fits
the request's budget (``max_queue_wait_s``, or the client's own timeout when shorter), and
``Reject`` otherwise: 429 with a Retry-After for overload (KV capacity, a full queue, a tenant's
budget, a deadline the wait would miss), 503 when no replica can serve the model at all, 400 when no
replica could ever hold the request. A newcomer never takes capacity that queued work of the same
or higher priority would get first: it is placed in the queue's order and admitted only if the walk
over that order, on a simulated copy of the fleet, reaches it with room to spare.

Every path is synchronous and takes ``now_s``; the edge performs the effects (reserve, wait on a
ticket, answer) and calls ``on_capacity_freed`` after each release or fleet change, ``expire`` on a
timer and ``cancel`` when a queued client disconnects.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from admission.calibration import Calibration
from admission.capacity import fits, kv_room_tokens
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
from routing.replica import ReplicaView, Role


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
        self._last_replicas: tuple[ReplicaView, ...] = ()
        self._drains: dict[str, tuple[tuple[object, ...], ReplicaDrain]] = {}
        self._fleet_drain: FleetDrain | None = None

    def observe_rates(self, rates: ServiceRates) -> None:
        """Feed smoothed inter-token latency and prefill rate (from the edge's measurements)."""
        self.rates = rates

    def decide(self, request: AdmissionRequest, replicas: Sequence[ReplicaView], now_s: float) -> Decision:
        self._last_replicas = tuple(replicas)
        cost = request.cost
        serving = [v for v in replicas if _routable(v, request.model, now_s)]
        if not serving:
            return self._no_replica(request.model, replicas, now_s)
        largest = max(v.capacity_kv_tokens for v in serving)
        if cost.kv_tokens > largest:
            return Reject(
                400,
                RejectReason.KV_CAPACITY,
                f"This request needs {cost.kv_tokens} tokens of KV cache ({cost.prompt_tokens} prompt + "
                f"{cost.max_output_tokens} max output) but the largest replica serving '{request.model}' "
                f"holds {largest}. Reduce the prompt or max_tokens.",
            )
        budget_wait_s = self.tenants.take(request.tenant, cost.kv_tokens, now_s)
        if budget_wait_s > 0.0:
            hint = retry_after(budget_wait_s, self.config.retry_after_cap_s)
            return Reject(
                429,
                RejectReason.TENANT_BUDGET,
                f"Tenant '{request.tenant.name}' is over its budget of {request.tenant.tokens_per_min} "
                f"tokens per minute; this request counts {cost.kv_tokens} (prompt + max output). "
                f"Retry after {hint.seconds} s.",
                hint,
            )
        queue_has_room = self._queue.has_room(cost.kv_tokens)
        wait_budget_s, client_bound = self._wait_budget(request)
        rank = request.tenant.priority.rank
        ticket = self._take_ticket()
        entry = QueuedRequest(ticket, request, now_s, now_s + wait_budget_s)
        fits_now = self._placer(replicas, now_s)(entry)
        if fits_now:
            if not self._queue.has_work_at_or_above(rank):
                self._queue.charge(request.tenant.name, request.tenant.weight, cost.kv_tokens)
                return Admit(fits_now)
            self._queue.push(entry)
            walk = self._queue.walk(now_s, self._placer(replicas, now_s), stop_at=ticket)
            self._queue.remove(ticket)
            for placed, candidates in walk.placed:
                if placed.ticket == ticket:
                    self._queue.charge(request.tenant.name, request.tenant.weight, cost.kv_tokens)
                    return Admit(candidates)
        ahead = self._queue.ahead(request.tenant, rank, request.model)
        expected_s = self._expected_wait_s(cost.kv_tokens, request.model, ahead, serving)
        if queue_has_room and expected_s <= wait_budget_s:
            self._queue.push(entry)
            return Queue(ticket, expected_s, now_s + wait_budget_s)
        self.tenants.refund(request.tenant, cost.kv_tokens)
        hint = retry_after(expected_s, self.config.retry_after_cap_s)
        if not queue_has_room:
            stats = self._queue.stats(now_s)
            return Reject(
                429,
                RejectReason.QUEUE_FULL,
                f"The admission queue is full ({stats.requests} requests, {stats.kv_tokens} tokens queued). "
                f"Retry after {hint.seconds} s.",
                hint,
            )
        return self._overload(request, expected_s, wait_budget_s, client_bound)

    def on_capacity_freed(self, replicas: Sequence[ReplicaView], now_s: float) -> list[Dispatch]:
        """Queued requests that fit now, in queue order, removed from the queue.

        Each dispatch's candidates assume the ones before it were placed on their first candidate;
        the edge routes and reserves them in order, and hands a dispatch that no longer fits any
        replica back with ``requeue``.
        """
        self._last_replicas = tuple(replicas)
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
                )
            )
        return dispatches

    def requeue(self, dispatch: Dispatch) -> None:
        """Put a dispatch that could not be placed back in its original place."""
        tenant = dispatch.request.tenant
        self._queue.refund(tenant.name, tenant.weight, dispatch.request.cost.kv_tokens)
        self._queue.push(
            QueuedRequest(dispatch.ticket, dispatch.request, dispatch.enqueued_at_s, dispatch.expires_at_s)
        )

    def expire(self, now_s: float, replicas: Sequence[ReplicaView] | None = None) -> list[Expired]:
        """Queued requests whose wait budget ran out: each with the 429 to answer it with."""
        if replicas is not None:
            self._last_replicas = tuple(replicas)
        expired: list[Expired] = []
        for entry in self._queue.expire(now_s):
            request = entry.request
            self.tenants.refund(request.tenant, entry.kv_tokens)
            serving = [v for v in self._last_replicas if _routable(v, request.model, now_s)]
            if serving:
                ahead = self._queue.ahead(request.tenant, entry.rank, request.model)
                expected_s = self._expected_wait_s(entry.kv_tokens, request.model, ahead, serving)
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
        return self._queue.stats(now_s)

    def is_queued(self, ticket: int) -> bool:
        return ticket in self._queue

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
        limit = self.config.max_active_sequences_per_replica
        return min(limit, view.max_sequences) if view.max_sequences > 0 else limit

    def _placer(self, replicas: Sequence[ReplicaView], now_s: float) -> Place:
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
            model = entry.request.model
            if best_room.get(model, kv_tokens) < kv_tokens:
                return ()
            serving = [v for v in simulated.values() if _routable(v, model, now_s)]
            fitting = [v for v in serving if fits(v, kv_tokens, self._max_active(v))]
            if not fitting:
                best_room[model] = max(
                    (kv_room_tokens(v) for v in serving if v.load.resident_sequences < self._max_active(v)),
                    default=0,
                )
                return ()
            fitting.sort(key=lambda v: -kv_room_tokens(v))
            chosen = fitting[0]
            load = chosen.load
            cost = entry.request.cost
            simulated[chosen.replica_id] = dataclasses.replace(
                chosen,
                load=dataclasses.replace(
                    load,
                    prefill_tokens_pending=load.prefill_tokens_pending + cost.prompt_tokens,
                    resident_sequences=load.resident_sequences + 1,
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
