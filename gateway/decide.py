"""The decision seam: given a parsed request, whether it goes, where, and when.

``Decider.decide`` receives a ``ProxyRequest`` and returns a ``Route`` (the replica, with the
reservation already taken in the ledger) or a ``Refusal`` (an OpenAI-shaped error). It tokenises,
prices the request (``admission.cost``), identifies the tenant, asks the ``AdmissionController``
over views of the live fleet, routes an admitted request with the ``Router`` and reserves; a queued
request awaits a future that the pump resolves with a route (``on_capacity_freed`` after every
release, on fleet changes and on a short timer that also expires overdue waits). A client that
leaves while queued cancels its ticket at once. ``release`` is called exactly once per ``Route``,
in the proxy's ``finally``; the ledger's release is idempotent, so a retry that moved the
reservation cannot release twice. Replica outcomes (passive health) feed the same
``HealthTracker`` as the active probes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from admission.controller import AdmissionController
from admission.cost import InvalidRequest, capped_body, estimate_cost, requested_work
from admission.counting import batch_of
from admission.deadline import client_timeout_s
from admission.decision import AdmissionRequest, Admit, Dispatch, Queue, Reject
from admission.ledger import NO_LOAD, Reservation
from admission.promises import retry_count
from admission.retry_after import ServiceRates
from admission.tenants import bearer_key
from config.schema import GatewayConfig
from gateway.errors import BadRequest, GatewayError, ServiceUnavailable, TooManyRequests, Unauthorized
from gateway.metrics import GatewayMetrics
from gateway.prompt import PromptEncoder
from gateway.state import GatewayState, ProxyRequest, ReplicaState
from gateway.upstream import replica_headers
from routing.health import (
    STARTING,
    HealthRules,
    HealthState,
    HealthTracker,
    Outcome,
    ReplicaHealth,
    outcome_of_status,
)
from routing.prefix_hash import block_hashes
from routing.request import RoutingRequest
from routing.retry_budget import RetryBudget
from routing.router import Router
from vocabulary.replica import ReplicaLoad, ReplicaView
from vocabulary.value import frozen_value

log = logging.getLogger("kvgate.decide")
_TTFT_EWMA_WEIGHT = 0.2
_ITL_EWMA_WEIGHT = 0.05
PUMP_INTERVAL_S = 0.05
CHAT_PATH = "/v1/chat/completions"
_UNBOUNDED = 1 << 40
EJECTED = HealthState.EJECTED


@frozen_value
class Route:
    replica: ReplicaState


@dataclass(frozen=True, slots=True)
class Refusal:
    error: GatewayError


_CLIENT_CREDENTIALS = frozenset({b"authorization", b"cookie"})


def _bearer_key(headers: list[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name == b"authorization":
            return bearer_key(value.decode("latin-1"))
    return None


def _never_refused(now_s: float) -> Reject | None:
    return None


def _refusal_of(reject: Reject) -> Refusal:
    seconds = None if reject.retry_after is None else reject.retry_after.milliseconds / 1000.0
    error: GatewayError
    if reject.status == 400:
        error = BadRequest(reject.message, param=reject.param, reason=reject.reason.value)
    elif reject.status == 503:
        error = ServiceUnavailable(reject.message, retry_after_s=seconds, reason=reject.reason.value)
    else:
        error = TooManyRequests(reject.message, retry_after_s=seconds, reason=reject.reason.value)
    return Refusal(error)


class KvgateDecider:
    def __init__(
        self,
        state: GatewayState,
        config: GatewayConfig,
        metrics: GatewayMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._state = state
        self._config = config.admission
        self._forward_credentials = config.server.forward_client_credentials
        self._metrics = metrics
        self._clock = clock
        self.controller = AdmissionController(self._config, state.ledger)
        self.router = Router(config.routing, random.Random(config.routing.seed))
        self.health = HealthTracker(
            HealthRules.from_config(
                config.routing, config.health.unhealthy_threshold, config.health.healthy_threshold
            )
        )
        self.retry_budget = RetryBudget.from_config(config.routing)
        self._encoder = PromptEncoder(config.models)
        state.removal_listeners.append(self.forget)
        for pool in config.pools:
            metrics.declare_pool(pool.name)
        self._waiting: dict[int, tuple[ProxyRequest, asyncio.Future[Route | Refusal]]] = {}
        self._routed: dict[str, ProxyRequest] = {}
        """Requests holding a reservation, by id, until released: their leases are renewed while
        the proxy still serves them (``renew_leases``)."""
        self._lease_s = state.ledger.lease_s
        self._renewed_at_s = clock()
        self._views: dict[str, tuple[ReplicaState, ReplicaHealth, ReplicaView]] = {}
        """Per replica id: the view last built, with the state and health it was built from."""
        self.foreign_loads: Callable[[], Mapping[str, ReplicaLoad]] = dict
        self.coordination_refusal: Callable[[float], Reject | None] = _never_refused
        """Asked before admission and before the pump dispatches (``RedisCoordinator.refusal``)."""
        self.session: aiohttp.ClientSession | None = None
        self._itl_s = self._config.default_inter_token_s
        self._pool_of_model = {
            m.name: next((p.name for p in config.pools if not p.models or m.name in p.models), "")
            for m in config.models
        }

    @property
    def metrics(self) -> GatewayMetrics:
        return self._metrics

    def views(self, now_s: float) -> list[ReplicaView]:
        """The fleet as the cores see it now. A replica's view is rebuilt only when something in
        it changed since the last call (its load, health, scrape or TTFT); otherwise the view
        built then is handed out again (views are frozen, so sharing is safe). Health states are
        frozen too: while a replica's is the same object its view fields are the ones its view
        holds, except an ejected replica's, which depend on the time (its back-off ends). A replica
        whose KV capacity is not known yet (``0``: none configured, none scraped) is not healthy in
        its view: admission has nothing to weigh it against; a capacity change rebuilds the view."""
        foreign = self.foreign_loads()
        loads = self._state.ledger.loads
        states = self.health.states
        cache = self._views
        views = []
        for r in self._state.replicas.values():
            replica_id = r.replica_id
            load = loads.get(replica_id, NO_LOAD)
            other = foreign.get(replica_id) if foreign else None
            if other is not None:
                load = ReplicaLoad(
                    load.prefill_tokens_pending + other.prefill_tokens_pending,
                    load.resident_sequences + other.resident_sequences,
                    load.remaining_decode_tokens + other.remaining_decode_tokens,
                    load.reserved_kv_tokens + other.reserved_kv_tokens,
                )
            health = states.get(replica_id, STARTING)
            capacity = r.kv_capacity_tokens
            cached = cache.get(replica_id)
            old = cached[2] if cached is not None and cached[0] is r else None
            if (
                old is not None
                and cached is not None
                and cached[1] is health
                and health.state is not EJECTED
                and old.capacity_kv_tokens == capacity
            ):
                healthy, ready_since_s, backoff_until_s = old.healthy, old.ready_since_s, old.backoff_until_s
            else:
                healthy, ready_since_s, backoff_until_s = health.view_fields(now_s)
                healthy = healthy and capacity > 0
            if (
                old is not None
                and old.load is load
                and old.healthy is healthy
                and old.ready_since_s == ready_since_s
                and old.backoff_until_s == backoff_until_s
                and old.scraped is r.scraped
                and old.ttft_ewma_s == r.ttft_ewma_s
                and old.capacity_kv_tokens == capacity
            ):
                views.append(old)
                continue
            view = ReplicaView(
                replica_id,
                r.url,
                r.pool,
                r.role,
                r.models,
                capacity,
                r.max_sequences,
                healthy,
                ready_since_s,
                load,
                r.scraped,
                r.ttft_ewma_s,
                backoff_until_s,
            )
            cache[replica_id] = (r, health, view)
            views.append(view)
        return views

    def queued_requests(self) -> list[ProxyRequest]:
        return [request for request, _ in self._waiting.values()]

    def routed_requests(self) -> list[ProxyRequest]:
        """Requests holding a reservation, each on ``request.replica`` once the proxy sent it."""
        return list(self._routed.values())

    def pool_of(self, model: str) -> str:
        return self._pool_of_model.get(model, "")

    async def decide(self, request: ProxyRequest) -> Route | Refusal:
        now_s = self._clock()
        request.arrived_s = now_s
        tenant = self.controller.tenants.identify(_bearer_key(request.headers))
        if tenant is None:
            return Refusal(Unauthorized("Incorrect API key provided.", reason="unauthorized"))
        request.tenant = tenant.name
        if not self._forward_credentials:
            request.upstream_headers = [
                h for h in request.upstream_headers if h[0] not in _CLIENT_CREDENTIALS
            ]
        chat = request.endpoint == CHAT_PATH
        batch = None if chat else batch_of(request.body)
        work = requested_work(request.body, chat, len(batch) if batch else 1, self._config)
        if isinstance(work, InvalidRequest):
            return Refusal(BadRequest(work.message, param=work.param, reason="invalid_request"))
        try:
            if batch is None:
                token_ids = await self._encode(request, request.body, len(request.raw_body))
                prompt_tokens: int | list[int] = len(token_ids)
            else:
                each = [
                    p if isinstance(p, list) else await self._encode(request, {"prompt": p}, len(p))
                    for p in batch
                ]
                token_ids, prompt_tokens = each[0], [len(ids) for ids in each]
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            log.warning("counting a prompt with a replica of %s failed: %r", request.model, exc)
            message = f"cannot count the prompt's tokens with a replica of '{request.model}'"
            retry_after_s = self._config.no_replica_retry_after_s
            return Refusal(ServiceUnavailable(message, retry_after_s=retry_after_s, reason="no_replica"))
        cost = estimate_cost(
            request.model,
            prompt_tokens,
            work.max_tokens,
            self._config,
            self._state.models[request.model],
            work.sequences_per_prompt,
        )
        if isinstance(cost, InvalidRequest):
            return Refusal(BadRequest(cost.message, param=cost.param, reason="invalid_request"))
        forwarded = capped_body(request.body, chat, cost.max_tokens)
        if forwarded is not None:
            request.body = forwarded
        if forwarded is not None or request.usage_injected:
            request.raw_body = orjson.dumps(request.body)
        headers = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in request.headers
            if name.startswith(b"x-")
        }
        admission = AdmissionRequest(
            request.request_id,
            tenant,
            cost,
            client_timeout_s(headers, self._config),
            request.raw_body,
            retry_count(headers),
        )
        request.admission = admission
        request.routing = RoutingRequest(
            request.model,
            cost.prompt_tokens,
            cost.max_output_tokens,
            tuple(block_hashes(token_ids)),
            cost.sequences,
        )
        self.retry_budget.record_request(now_s)
        pool = self.pool_of(request.model)
        if not self._config.enabled:
            return self._route_unadmitted(request, now_s)
        blind = self.coordination_refusal(now_s)
        if blind is not None:
            self._metrics.count_decision("reject", blind.reason.value, pool=pool, model=request.model)
            return _refusal_of(blind)
        decision = self.controller.decide(admission, self.views(now_s), now_s)
        if isinstance(decision, Reject):
            self._metrics.count_decision("reject", decision.reason.value, pool=pool, model=request.model)
            return _refusal_of(decision)
        if isinstance(decision, Admit):
            route = self._place(request, decision.candidates, now_s)
            if route is not None:
                self._metrics.count_admitted(pool, request.model, "fits", 0.0)
                return route
            self._metrics.count_decision("reject", "no_replica", pool=pool, model=request.model)
            message = f"No replica serving '{request.model}' can take the request now."
            retry_after_s = self._config.no_replica_retry_after_s
            return Refusal(ServiceUnavailable(message, retry_after_s=retry_after_s, reason="no_replica"))
        self._metrics.count_decision("queue", "kv_capacity", pool=pool, model=request.model)
        return await self._wait(request, decision)

    def _route_unadmitted(self, request: ProxyRequest, now_s: float) -> Route | Refusal:
        """Admission off: route among every healthy replica as if each had unbounded KV room."""
        route = self._place(request, self._unbounded_views(now_s), now_s)
        pool = self.pool_of(request.model)
        if route is None:
            self._metrics.count_decision("reject", "no_replica", pool=pool, model=request.model)
            retry_after_s = self._config.no_replica_retry_after_s
            message = f"No replica serving '{request.model}' is available."
            return Refusal(ServiceUnavailable(message, retry_after_s=retry_after_s, reason="no_replica"))
        self._metrics.count_admitted(pool, request.model, "admission_off", None)
        return route

    def _unbounded_views(self, now_s: float) -> tuple[ReplicaView, ...]:
        return tuple(
            dataclasses.replace(v, capacity_kv_tokens=_UNBOUNDED, max_sequences=_UNBOUNDED)
            for v in self.views(now_s)
        )

    async def _encode(self, request: ProxyRequest, body: Mapping[str, Any], size_bytes: int) -> list[int]:
        """The token ids of ``body``'s prompt (the request's, or one prompt of its batch): inline when
        counted here and small, otherwise off the event loop or by a replica of the model."""
        token_ids = self._encoder.encode_inline(request.model, body, size_bytes)
        if token_ids is not None:
            return token_ids
        assert self.session is not None, "gateway not started"
        url = ""
        headers = None
        if not self._encoder.is_local(request.model):
            serving = self._state.routable(request.model)
            url = serving[0].url if serving else ""
            headers = replica_headers(serving[0]) if serving else None
        return await self._encoder.encode(request.model, body, size_bytes, self.session, url, headers)

    def _place(
        self, request: ProxyRequest, candidates: tuple[ReplicaView, ...], now_s: float
    ) -> Route | None:
        assert request.routing is not None and request.admission is not None
        choice = self.router.choose(request.routing, candidates, now_s, exclude=request.tried)
        if choice.replica_id is None:
            return None
        replica = self._state.replicas.get(choice.replica_id)
        if replica is None:
            return None
        cost = request.admission.cost
        if not self._state.ledger.reserve(request.request_id, replica.replica_id, cost, now_s):
            raise RuntimeError(f"request {request.request_id} already holds a reservation")
        self._routed[request.request_id] = request
        request.tried.append(replica.replica_id)
        return Route(replica)

    async def _wait(self, request: ProxyRequest, queued: Queue) -> Route | Refusal:
        future: asyncio.Future[Route | Refusal] = asyncio.get_running_loop().create_future()
        self._waiting[queued.ticket] = (request, future)
        self._state.queued = len(self._waiting)
        try:
            outcome = await future
        except asyncio.CancelledError:
            if self._waiting.pop(queued.ticket, None) is not None:
                self.controller.cancel(queued.ticket)
            elif future.done() and not future.cancelled():
                self._state.ledger.release(request.request_id)
                self.pump()
            raise
        finally:
            self._waiting.pop(queued.ticket, None)
            self._state.queued = len(self._waiting)
        request.queue_wait_s = self._clock() - request.arrived_s
        self._metrics.observe_queue_wait(self.pool_of(request.model), request.model, request.queue_wait_s)
        return outcome

    def pump(self) -> None:
        """Dispatch what fits now: route and reserve synchronously, then wake the waiters."""
        if not self._waiting:
            return
        now_s = self._clock()
        if self.coordination_refusal(now_s) is not None:
            return
        for dispatch in self.controller.on_capacity_freed(self.views(now_s), now_s):
            self._dispatch(dispatch, now_s)

    def _dispatch(self, dispatch: Dispatch, now_s: float) -> None:
        waiting = self._waiting.pop(dispatch.ticket, None)
        if waiting is None:
            return
        request, future = waiting
        if future.done():
            # The client left and its task has not heard yet: route nothing for it.
            self.controller.requeue(dispatch)
            self.controller.cancel(dispatch.ticket)
            return
        route = self._place(request, dispatch.candidates, now_s)
        if route is None:
            self.controller.requeue(dispatch)
            self._waiting[dispatch.ticket] = waiting
            return
        future.set_result(route)

    def tick(self) -> None:
        """Renew the leases of requests in flight, release reservations whose lease ran out, expire
        overdue waits (each answered with its 429) and dispatch what fits."""
        now_s = self._clock()
        if now_s - self._renewed_at_s >= self._lease_s / 3:
            self.renew_leases(now_s)
        lapsed = self._state.ledger.expire(now_s)
        if lapsed:
            self._count_expired(lapsed)
        if not self._waiting:
            return
        views = self.views(now_s)
        for expired in self.controller.expire(now_s, views):
            waiting = self._waiting.pop(expired.ticket, None)
            if waiting is not None and not waiting[1].done():
                pool = self.pool_of(waiting[0].model)
                reason = expired.reject.reason.value
                self._metrics.count_decision("reject", reason, pool=pool, model=waiting[0].model)
                waiting[1].set_result(_refusal_of(expired.reject))
        self._state.queued = len(self._waiting)
        self.pump()

    def renew_leases(self, now_s: float) -> None:
        """Renew the reservation of every request the proxy still serves; a finished request that
        still holds one leaked it, and its lease is left to run out."""
        self._renewed_at_s = now_s
        ledger = self._state.ledger
        for request_id, request in list(self._routed.items()):
            if request.finished:
                del self._routed[request_id]
            else:
                ledger.renew(request_id, now_s)

    def _count_expired(self, expired: Sequence[Reservation]) -> None:
        for held in expired:
            replica = self._state.replicas.get(held.replica_id)
            pool = replica.pool if replica is not None else self.pool_of(held.cost.model)
            self._metrics.count_expired(pool)
            log.warning(
                "reservation of request %s on replica %s (%d KV tokens) expired after its %g s lease "
                "and was released: its request never released it",
                held.request_id,
                held.replica_id,
                held.kv_tokens,
                self._lease_s,
            )
        self.pump()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(PUMP_INTERVAL_S)
            self.tick()

    def retry(self, request: ProxyRequest, error: GatewayError) -> Route | None:
        """Another replica for a request whose replica failed before the first byte, or None."""
        now_s = self._clock()
        self._state.ledger.release(request.request_id)
        verdict = self.retry_budget.decide(now_s, len(request.tried) - 1, request.response_started)
        if not verdict.allowed or request.routing is None or request.admission is None:
            self._metrics.count_retry(self.pool_of(request.model), verdict.reason)
            self.pump()
            return None
        if self._config.enabled:
            candidates = self.controller.retry_candidates(request.admission, self.views(now_s), now_s)
        else:
            candidates = self._unbounded_views(now_s)
        route = self._place(request, candidates, now_s)
        self._metrics.count_retry(self.pool_of(request.model), "no_replica" if route is None else "retry")
        if route is None:
            self.pump()
        return route

    def release(self, request: ProxyRequest, route: Route) -> None:
        self._state.ledger.release(request.request_id)
        self._routed.pop(request.request_id, None)
        if request.ttft_s is not None:
            self._metrics.observe_ttft(route.replica.pool, request.model, request.ttft_s)
        admission = request.admission
        if admission is not None and request.prompt_tokens is not None:
            used = request.prompt_tokens + (request.completion_tokens or 0)
            self.controller.settle(admission, used)
        self.pump()

    def observe(self, replica: ReplicaState, status: int | None, retry_after_s: float | None = None) -> None:
        """A replica's answer (``None``: no answer) as passive health. A success on a replica already
        healthy with no failure pending changes nothing the probes would not, so it is skipped."""
        outcome = outcome_of_status(status)
        if outcome is Outcome.SUCCESS:
            health = self.health.get(replica.replica_id)
            if health.state is HealthState.HEALTHY and not health.consecutive_failures:
                return
        self.observe_outcome(replica, outcome, retry_after_s)

    def observe_outcome(
        self, replica: ReplicaState, outcome: Outcome, retry_after_s: float | None = None
    ) -> None:
        now_s = self._clock()
        before = self.health.get(replica.replica_id).state
        after = self.health.observe(replica.replica_id, outcome, now_s, retry_after_s)
        replica.healthy = after.routable(now_s)
        self._metrics.observe_health(replica, ejected=after.state is EJECTED and before is not EJECTED)
        if after.state is HealthState.EJECTED and before is not HealthState.EJECTED:
            self.router.forget(replica.replica_id)
        elif after.state is HealthState.HEALTHY and before is not HealthState.HEALTHY:
            self.pump()

    def forget(self, replica_id: str) -> None:
        self._views.pop(replica_id, None)
        self._metrics.forget_replica(replica_id)
        self.router.forget(replica_id)
        self.health.remove(replica_id)

    def first_token(self, request: ProxyRequest, replica: ReplicaState, now_s: float) -> None:
        """The first token reached the client. A stream's TTFT is recorded now, so the ``/signals``
        window does not lag by the whole generation; a whole response's goes with its other
        measurements in ``finished`` (one metrics call)."""
        self._state.ledger.first_token(request.request_id)
        request.first_token_s = now_s
        ttft_s = now_s - request.arrived_s
        if request.stream:
            self._metrics.observe_ttft(replica.pool, request.model, ttft_s)
        else:
            request.ttft_s = ttft_s
        previous = replica.ttft_ewma_s
        replica.ttft_ewma_s = (
            ttft_s if previous is None else previous + _TTFT_EWMA_WEIGHT * (ttft_s - previous)
        )

    def produced(self, request: ProxyRequest, tokens: int) -> None:
        self._state.ledger.produced(request.request_id, tokens)

    def finished(
        self,
        request: ProxyRequest,
        replica: ReplicaState,
        itl_s: float | None,
        now_s: float,
        itl_gaps_s: Sequence[float] = (),
    ) -> None:
        """Record what a completed response said about tokens and latency: ``itl_s`` is the stream's
        mean inter-token gap (it feeds the admission rates), ``itl_gaps_s`` every gap."""
        if itl_s is not None:
            self._itl_s += _ITL_EWMA_WEIGHT * (itl_s - self._itl_s)
            rates = self.controller.rates
            self.controller.observe_rates(ServiceRates(self._itl_s, rates.prefill_tokens_per_s))
        admission = request.admission
        prompt_tokens = request.prompt_tokens
        output_tokens = request.completion_tokens or 0
        estimated = None
        if prompt_tokens is not None and admission is not None:
            estimated = admission.cost.prompt_tokens
            calibration = self.controller.calibration
            calibration.observe_prompt(request.model, estimated, prompt_tokens)
            calibration.observe_output(request.model, output_tokens)
        ttft_s, request.ttft_s = request.ttft_s, None
        self._metrics.record_response(
            replica.pool,
            request.model,
            ttft_s,
            now_s - request.arrived_s,
            itl_gaps_s,
            prompt_tokens if admission is not None else None,
            output_tokens,
            estimated,
        )

    def cancel_all(self) -> None:
        for _, future in self._waiting.values():
            with contextlib.suppress(asyncio.InvalidStateError):
                future.cancel()
        self._waiting.clear()
