"""A disaggregated request's second hop: its KV handed off from a prefill replica to a decode one.

Apart from ``kvgate.gateway.request_path.dispatcher`` (which extends ``DecodeHandOff``) because it
is its own decision: once the prefill replica has the prompt's KV, the prefill reservation goes
back and the request's whole worst case is reserved on a decode replica with room, chosen by load
alone; a decode replica that fails before the first byte is replaced under the retry budget.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvgate.admission import refusals
from kvgate.admission.decision import Refusal
from kvgate.gateway.state import GatewayState, ProxyRequest, ReplicaState
from kvgate.routing.request import RoutingRequest
from kvgate.vocabulary.capacity import own_slots, takes_handoff
from kvgate.vocabulary.clock import Clock
from kvgate.vocabulary.replica import ReplicaView
from kvgate.vocabulary.value import frozen_value

if TYPE_CHECKING:
    from kvgate.admission.controller import AdmissionController
    from kvgate.config.admission import AdmissionConfig
    from kvgate.gateway.replicas.fleet import Fleet
    from kvgate.gateway.telemetry.metrics import GatewayMetrics
    from kvgate.routing.retry_budget import RetryBudget
    from kvgate.routing.router import Router


@frozen_value
class Route:
    replica: ReplicaState


class DecodeHandOff:
    """The decode hop of ``Dispatcher``; the attributes are the dispatcher's."""

    _state: GatewayState
    _config: AdmissionConfig
    _metrics: GatewayMetrics
    _fleet: Fleet
    _clock: Clock
    controller: AdmissionController
    router: Router
    retry_budget: RetryBudget

    def pump(self) -> None:
        raise NotImplementedError

    def hand_off(self, request: ProxyRequest) -> Route | Refusal:
        """The prefill replica handed the request's KV off: its prefill reservation goes back and its
        whole worst case is reserved on a decode replica with room, chosen by load alone (the prefix
        cache lives on the prefill side), or the refusal that says why none has room."""
        assert request.admission is not None and request.routing is not None, "priced before handed off"
        now_s = self._clock()
        model = request.model
        self._state.ledger.release(request.request_id)
        self.pump()
        room: tuple[ReplicaView, ...] | Refusal
        enabled = self._config.enabled
        if enabled:
            room = self.controller.decode_room(request.admission, self._fleet.snapshot(now_s))
        else:
            room = tuple(v for v in self._fleet.views(now_s) if takes_handoff(v, model, now_s))
        if isinstance(room, Refusal):
            return room
        routing = request.routing
        decode = RoutingRequest(
            model, routing.prompt_tokens, routing.max_output_tokens, (), routing.sequences
        )
        slots = self.controller.max_active if enabled else own_slots
        choice = self.router.choose(
            decode, room, now_s, exclude=request.tried, check_room=enabled, slots=slots
        )
        replica = None if choice.replica_id is None else self._state.replicas.get(choice.replica_id)
        if replica is None:
            message = f"No decode replica serving '{model}' can take the request now."
            return refusals.no_replica(message, self._config.no_replica_retry_after_s, self._config)
        self._state.ledger.reserve(request.request_id, replica.replica_id, request.admission.cost, now_s)
        request.tried.append(replica.replica_id)
        return Route(replica)

    def count_handoff_refusal(self, request: ProxyRequest, refusal: Refusal) -> None:
        pool = self._fleet.pool_of(request.model)
        self._metrics.count_decision("reject", refusal.reason.value, pool=pool, model=request.model)

    def retry_hand_off(self, request: ProxyRequest) -> Route | None:
        """Another decode replica for a request whose decode replica failed before the first byte
        (the prefill replica still holds its KV), under the retry budget; None when there is none."""
        now_s = self._clock()
        self._state.ledger.release(request.request_id)
        retries = len(request.tried) - 2
        verdict = self.retry_budget.allow(now_s, retries, request.response_started)
        pool = self._fleet.pool_of(request.model)
        if not verdict.allowed:
            self._metrics.count_retry(pool, verdict.reason)
            self.pump()
            return None
        route = self.hand_off(request)
        self._metrics.count_retry(pool, "retry" if isinstance(route, Route) else "no_replica")
        return route if isinstance(route, Route) else None
