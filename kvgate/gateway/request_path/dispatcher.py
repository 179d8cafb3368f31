"""Admit and route a priced request, hold its reservation while it is served, release it once.

``Dispatcher.admit`` asks the ``AdmissionController`` over one ``FleetSnapshot``: an admitted
request is routed at once among the candidates admission returned (``Router.choose``) and its
reservation taken in the ledger; a queued one waits on a future that the ``AdmissionPump``
resolves with a route when it fits (after every release, on fleet changes and on a short timer that
also expires overdue waits, each answered with its refusal); a refused one gets its ``Refusal``.
A client that leaves while queued stops counting at once. ``release`` is called exactly once per
``Route``, in the proxy's ``finally``; the ledger's release is idempotent, so a retry that moved
the reservation cannot release twice. While a request is served its reservation's lease is
renewed (``kvgate.gateway.request_path.leases``); one its request never released runs out and is
counted as expired. A disaggregated request's second hop, to a decode replica, is
``kvgate.gateway.request_path.decode_hand_off``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from kvgate.admission import refusals
from kvgate.admission.controller import AdmissionController
from kvgate.admission.decision import Admit, Decision, Dispatch, Queue, Refusal, RefusalReason
from kvgate.admission.disaggregation import prefill_cost
from kvgate.admission.pump import AdmissionPump, Placement
from kvgate.config.gateway import GatewayConfig
from kvgate.gateway.replicas.fleet import Fleet
from kvgate.gateway.request_path.decode_hand_off import DecodeHandOff
from kvgate.gateway.request_path.decode_hand_off import Route as Route
from kvgate.gateway.request_path.leases import Leases
from kvgate.gateway.state import GatewayState, ProxyRequest
from kvgate.gateway.telemetry.metrics import GatewayMetrics
from kvgate.routing.filters import NO_REPLICA
from kvgate.routing.policies.kvgate import PREFIX_HOLDER_FULL
from kvgate.routing.retry_budget import RetryBudget
from kvgate.routing.router import Router
from kvgate.vocabulary.capacity import own_slots
from kvgate.vocabulary.clock import Clock
from kvgate.vocabulary.replica import ReplicaView, Role
from kvgate.vocabulary.snapshot import FleetSnapshot

PUMP_INTERVAL_S = 0.05


QueuedWaiter = tuple[ProxyRequest, "asyncio.Future[Route | Refusal]"]
Waiting = Coroutine[Any, Any, "Route | Refusal"]
"""``Dispatcher.admit_now``'s answer for a request that must wait for its route or refusal."""


def _never_refused(now_s: float) -> Refusal | None:
    return None


def _nothing(kv_tokens: int, sequences: int) -> None:
    return None


def _unforeseeable(refusal: Refusal) -> bool:
    """A refusal for capacity with no honest wait: nothing admitted through this gateway frees room
    for the request within the Retry-After cap."""
    return (
        refusal.status == 429
        and refusal.reason is not RefusalReason.TENANT_BUDGET
        and refusal.retry_after is not None
        and not refusal.retry_after.honest
    )


class Dispatcher(DecodeHandOff):
    def __init__(
        self,
        state: GatewayState,
        config: GatewayConfig,
        metrics: GatewayMetrics,
        fleet: Fleet,
        controller: AdmissionController,
        router: Router,
        clock: Clock,
    ) -> None:
        self._state = state
        self._config = config.admission
        self._metrics = metrics
        self._fleet = fleet
        self._clock = clock
        self.controller = controller
        self.router = router
        self.retry_budget = RetryBudget.from_config(config.routing)
        self._pump: AdmissionPump[QueuedWaiter] = AdmissionPump(controller)
        self.leases = Leases(state, metrics, fleet.pool_of, clock())
        self.coordination_refusal: Callable[[float], Refusal | None] = _never_refused
        """Asked before admission and before the pump dispatches (``RedisCoordinator.refusal``)."""
        self.top_up: Callable[[int, int], Awaitable[bool]] | None = None
        """With coordination: grow this gateway's claims now, if the fleet has the room, and say
        whether they grew (``RedisCoordinator.top_up_now``)."""
        self.on_unmet: Callable[[int, int], None] = _nothing
        """Called when a request is queued (with 0, 0) or refused for capacity (with its KV tokens and
        sequences): demand the fleet did not take (``RedisCoordinator.top_up``)."""
        self._disaggregated = {m.name for m in config.models if config.disaggregated(m.name)}
        """Models with a prefill+decode pair: their decode room is asked before the prefill hop."""
        self._split = {
            m.name: m.disaggregated_share
            for m in config.models
            if m.name in self._disaggregated and config.serving(m.name)["mixed"]
        }
        """Models served both ways (a migration), with the share sent through the pair."""
        self._split_credit = dict.fromkeys(self._split, 0.0)

    def queued_requests(self) -> list[ProxyRequest]:
        return [request for request, _ in self._pump.waiters()]

    async def admit(self, request: ProxyRequest) -> Route | Refusal:
        outcome = self.admit_now(request)
        return outcome if isinstance(outcome, (Route, Refusal)) else await outcome

    def admit_now(self, request: ProxyRequest) -> Route | Refusal | Waiting:
        """``admit`` as a plain call: the route or the refusal when the answer is known at once (the
        common case, with no coroutine), otherwise the coroutine that waits for it (queued, or
        topping up this gateway's claims first), to be awaited at once."""
        assert request.admission is not None, "priced before admitted"
        now_s = self._clock()
        self.retry_budget.record_request(now_s)
        model = request.model
        pool = self._fleet.pool_of(model)
        if not self._config.enabled:
            return self._route_unadmitted(request, now_s)
        blind = self.coordination_refusal(now_s)
        if blind is not None:
            self._metrics.count_decision("reject", blind.reason.value, pool=pool, model=model)
            return blind
        snapshot = self._fleet.snapshot(now_s)
        if model in self._disaggregated:
            snapshot = self._phase(request, snapshot)
            if request.disaggregated is not False:
                room = self.controller.decode_room(request.admission, snapshot)
                if isinstance(room, Refusal):
                    self._metrics.count_decision("reject", room.reason.value, pool=pool, model=model)
                    return room
        decision = self.controller.admit(request.admission, snapshot)
        if (
            isinstance(decision, Refusal)
            and self.top_up is not None
            and model not in self._disaggregated
            and _unforeseeable(decision)
        ):
            return self._topped_up(request, decision, now_s, pool)
        return self._decided(request, decision, now_s, pool, topped_up=False)

    async def _topped_up(
        self, request: ProxyRequest, decision: Decision, now_s: float, pool: str
    ) -> Route | Refusal:
        """Nothing this gateway holds frees room for the request (its claims are too small), yet
        the fleet may have the room: ask Redis for it now rather than tell the client not to retry."""
        assert request.admission is not None and self.top_up is not None
        cost = request.admission.cost
        if await self.top_up(cost.kv_tokens, cost.sequences):
            now_s = self._clock()
            decision = self.controller.admit(request.admission, self._fleet.snapshot(now_s))
        outcome = self._decided(request, decision, now_s, pool, topped_up=True)
        return outcome if isinstance(outcome, (Route, Refusal)) else await outcome

    def _decided(
        self, request: ProxyRequest, decision: Decision, now_s: float, pool: str, topped_up: bool
    ) -> Route | Refusal | Waiting:
        """Act on admission's ``decision``: route and reserve, refuse, or wait in the queue."""
        assert request.admission is not None
        model = request.model
        if isinstance(decision, Refusal):
            self._metrics.count_decision("reject", decision.reason.value, pool=pool, model=model)
            if (
                not topped_up
                and decision.status == 429
                and decision.reason is not RefusalReason.TENANT_BUDGET
            ):
                self.on_unmet(request.admission.cost.kv_tokens, request.admission.cost.sequences)
            return decision
        if isinstance(decision, Admit):
            hold_until_s = self.router.hold_until_s(now_s)
            # Every candidate has room: admission's ``fits_sharing`` over this snapshot, the same
            # check the router's room filter would repeat.
            route = self._place(
                request, decision.candidates, now_s, hold_until_s=hold_until_s, room_checked=True
            )
            if isinstance(route, Route):
                self._metrics.count_admitted(pool, model, "fits", 0.0)
                return route
            if route == PREFIX_HOLDER_FULL:
                self._metrics.count_decision("queue", route, pool=pool, model=model)
                return self._wait(request, self.controller.defer(request.admission, now_s), now_s)
            self.controller.unadmit(request.admission)
            self._metrics.count_decision("reject", "no_replica", pool=pool, model=model)
            message = f"No replica serving '{model}' can take the request now."
            return refusals.no_replica(message, self._config.no_replica_retry_after_s, self._config)
        self._metrics.count_decision("queue", "kv_capacity", pool=pool, model=model)
        self.on_unmet(0, 0)
        return self._wait(request, decision, now_s)

    def _phase(self, request: ProxyRequest, snapshot: FleetSnapshot) -> FleetSnapshot:
        """For a model served both ways, whether this request goes through the pair: every
        ``1 / share``-th request does (deterministic, so a replay splits alike), and the snapshot
        it is admitted over keeps only the replicas of its way."""
        share = self._split.get(request.model)
        if share is None:
            return snapshot
        credit = self._split_credit[request.model] + share
        request.disaggregated = credit >= 1.0
        self._split_credit[request.model] = credit - 1.0 if request.disaggregated else credit
        return self._of_its_way(request, snapshot)

    def _of_its_way(self, request: ProxyRequest, snapshot: FleetSnapshot) -> FleetSnapshot:
        if request.disaggregated is None:
            return snapshot
        skip = Role.MIXED if request.disaggregated else Role.PREFILL
        kept = tuple(v for v in snapshot.replicas if v.role is not skip)
        return FleetSnapshot(snapshot.now_s, kept, snapshot.resident)

    def _route_unadmitted(self, request: ProxyRequest, now_s: float) -> Route | Refusal:
        """Admission off: route among every healthy replica without the room filter (the replicas queue
        what does not fit), on the real views, so the load scorer still sees real load."""
        route = self._place(request, self._first_hop_views(request, now_s), now_s, check_room=False)
        pool = self._fleet.pool_of(request.model)
        if not isinstance(route, Route):
            self._metrics.count_decision("reject", "no_replica", pool=pool, model=request.model)
            message = f"No replica serving '{request.model}' is available."
            return refusals.no_replica(message, self._config.no_replica_retry_after_s, self._config)
        self._metrics.count_admitted(pool, request.model, "admission_off", None)
        return route

    def _first_hop_views(self, request: ProxyRequest, now_s: float) -> Sequence[ReplicaView]:
        """Admission off: where the request's first hop may go (never a decode replica, which takes
        work only by hand-off)."""
        views = self._fleet.views(now_s)
        if request.model not in self._disaggregated:
            return views
        if request.disaggregated is None and request.model in self._split:
            self._phase(request, FleetSnapshot(now_s, ()))
        snapshot = self._of_its_way(request, FleetSnapshot(now_s, tuple(views)))
        return tuple(v for v in snapshot.replicas if v.role is not Role.DECODE)

    def _place(
        self,
        request: ProxyRequest,
        candidates: Sequence[ReplicaView],
        now_s: float,
        check_room: bool = True,
        hold_until_s: float = float("-inf"),
        room_checked: bool = False,
    ) -> Route | str:
        """Route and reserve, or the router's reason for no replica. ``room_checked``: admission
        has just found room on every candidate, so the router's room filter is not asked again
        (its sequence slots still count a replica's load under the guard)."""
        assert request.routing is not None and request.admission is not None
        ledger = self._state.ledger
        routing = request.routing
        slots = self.controller.max_active if check_room else own_slots
        choice = self.router.choose(
            routing,
            candidates,
            now_s,
            request.tried,
            check_room and not room_checked,
            hold_until_s,
            ledger,
            slots,
            self.controller.rates.prefill_tokens_per_s,
        )
        if choice.replica_id is None:
            return choice.reason
        replica = self._state.replicas.get(choice.replica_id)
        if replica is None:
            return NO_REPLICA
        cost = request.admission.cost
        if replica.role is Role.PREFILL:
            cost = prefill_cost(cost)
        reserved = ledger.reserve(
            request.request_id,
            replica.replica_id,
            cost,
            now_s,
            routing.block_hashes,
            choice.cached_prompt_tokens,
        )
        if not reserved:
            raise RuntimeError(f"request {request.request_id} already holds a reservation")
        self.leases.hold(request)
        request.tried.append(replica.replica_id)
        request.cached_tokens_expected = choice.cached_prompt_tokens
        return Route(replica)

    async def _wait(self, request: ProxyRequest, queued: Queue, queued_at_s: float) -> Route | Refusal:
        future: asyncio.Future[Route | Refusal] = asyncio.get_running_loop().create_future()
        self._pump.wait(queued.ticket, (request, future))
        self._state.queued = len(self._pump)
        try:
            outcome = await future
        except asyncio.CancelledError:
            if not self._pump.leave(queued.ticket) and future.done() and not future.cancelled():
                self._state.ledger.release(request.request_id)
                self.pump()
            raise
        finally:
            self._state.queued = len(self._pump)
        now_s = self._clock()
        request.queue_wait_s = now_s - request.arrived_s
        pool = self._fleet.pool_of(request.model)
        self._metrics.observe_queue_wait(pool, request.model, request.queue_wait_s)
        budget_s = queued.expires_at_s - queued_at_s
        self._metrics.observe_queue_forecast(
            pool, request.model, now_s - queued_at_s, queued.expected_wait_s, budget_s
        )
        return outcome

    def pump(self) -> None:
        """Dispatch what fits now: route and reserve synchronously, then wake the waiters."""
        if not len(self._pump):
            return
        now_s = self._clock()
        if self.coordination_refusal(now_s) is not None:
            return
        self._pump.dispatch(self._fleet.snapshot(now_s), self._dispatch)

    def _dispatch(self, waiter: QueuedWaiter, dispatch: Dispatch, now_s: float) -> Placement:
        request, future = waiter
        if future.done():
            return Placement.GONE  # the client left and its task has not heard yet
        route = self._place(
            request,
            self._now_views(dispatch.candidates, now_s),
            now_s,
            hold_until_s=self._hold_until_s(dispatch),
        )
        if not isinstance(route, Route):
            return Placement.NO_ROOM
        future.set_result(route)
        return Placement.PLACED

    def _now_views(self, candidates: Sequence[ReplicaView], now_s: float) -> list[ReplicaView]:
        """``candidates`` with their loads as they are now. A dispatch's candidates are views of the
        cycle's snapshot, and the dispatches before it in the cycle were since reserved on whichever
        of theirs the router chose, not necessarily where the queue walk assumed: routed on the
        snapshot's loads, two dispatches of one cycle could both take the last room of one replica."""
        views = {view.replica_id: view for view in self._fleet.views(now_s)}
        return [views[v.replica_id] for v in candidates if v.replica_id in views]

    def _hold_until_s(self, dispatch: Dispatch) -> float:
        """A queued request's hold for its prefix's replica, from when it queued (``Router.hold_until_s``)."""
        budget_s = dispatch.expires_at_s - dispatch.enqueued_at_s
        return self.router.hold_until_s(dispatch.enqueued_at_s, budget_s, dispatch.promised_due_s is not None)

    def tick(self) -> None:
        """Keep the leases (``Leases.upkeep``), expire overdue waits (each answered with its 429)
        and dispatch what fits."""
        now_s = self._clock()
        if self.leases.upkeep(now_s):
            self.pump()
        if not len(self._pump):
            return
        for (request, future), refusal in self._pump.expire(self._fleet.snapshot(now_s)):
            if not future.done():
                pool = self._fleet.pool_of(request.model)
                self._metrics.count_decision("reject", refusal.reason.value, pool=pool, model=request.model)
                future.set_result(refusal)
        self._state.queued = len(self._pump)
        self.pump()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(PUMP_INTERVAL_S)
            self.tick()

    def retry(self, request: ProxyRequest) -> Route | None:
        """Another replica for a request whose replica failed before the first byte, or None."""
        now_s = self._clock()
        self._state.ledger.release(request.request_id)
        pool = self._fleet.pool_of(request.model)
        verdict = self.retry_budget.allow(now_s, len(request.tried) - 1, request.response_started)
        if not verdict.allowed or request.routing is None or request.admission is None:
            self._metrics.count_retry(pool, verdict.reason)
            self.pump()
            return None
        if self._config.enabled:
            snapshot = self._of_its_way(request, self._fleet.snapshot(now_s))
            candidates = self.controller.retry_candidates(request.admission, snapshot)
            route = self._place(request, candidates, now_s)
        else:
            route = self._place(request, self._first_hop_views(request, now_s), now_s, check_room=False)
        if not isinstance(route, Route):
            self._metrics.count_retry(pool, "no_replica")
            self.pump()
            return None
        self._metrics.count_retry(pool, "retry")
        return route

    def release(self, request: ProxyRequest) -> None:
        """The request is over: its reservation goes back, its tenant is refunded what its worst case
        over-charged, and queued work that fits now is dispatched."""
        self._state.ledger.release(request.request_id)
        self.leases.drop(request)
        admission = request.admission
        if admission is not None and request.prompt_tokens is not None:
            used = request.prompt_tokens + (request.completion_tokens or 0)
            self.controller.settle(admission, used)
        self.pump()

    def cancel_all(self) -> None:
        for _, future in self._pump.clear():
            with contextlib.suppress(asyncio.InvalidStateError):
                future.cancel()
