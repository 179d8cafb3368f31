"""The decision seam: given a parsed request, where does it go, or why not.

``Decider.decide`` receives a ``ProxyRequest`` (model, stream flag, parsed body, raw headers) and
returns a ``Route`` (the replica) or a ``Refusal`` (an error to answer with, e.g. 503 + Retry-After).
It may await (a queue), and it must give up promptly when cancelled (the client left).
``Decider.release`` is called exactly once for every ``Route`` decide returned, in the proxy's
``finally``, whatever the outcome. The placeholder policy is round-robin over healthy replicas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gateway.errors import GatewayError, ServiceUnavailable
from gateway.state import GatewayState, ProxyRequest, ReplicaState


@dataclass(frozen=True, slots=True)
class Route:
    replica: ReplicaState


@dataclass(frozen=True, slots=True)
class Refusal:
    error: GatewayError


class Decider(Protocol):
    async def decide(self, request: ProxyRequest) -> Route | Refusal: ...

    def release(self, request: ProxyRequest, route: Route) -> None: ...


class RoundRobin:
    """Each model's healthy replicas in turn."""

    def __init__(self, state: GatewayState, retry_after_s: float) -> None:
        self._state = state
        self._retry_after_s = retry_after_s
        self._turn: dict[str, int] = {}

    async def decide(self, request: ProxyRequest) -> Route | Refusal:
        candidates = self._state.routable(request.model)
        if not candidates:
            return Refusal(
                ServiceUnavailable(
                    f"no healthy replica serves model `{request.model}`", retry_after_s=self._retry_after_s
                )
            )
        turn = self._turn.get(request.model, 0)
        self._turn[request.model] = turn + 1
        return Route(candidates[turn % len(candidates)])

    def release(self, request: ProxyRequest, route: Route) -> None:
        return None
