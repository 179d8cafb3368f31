"""The two hops of a disaggregated request, as vLLM's disaggregated serving expects them.

A request routed to a prefill replica is served by ``Handoff.serve``: the prefill replica gets it
rewritten for one token (``prefill_body``: vLLM's proxy protocol for the NixlConnector and
P2pNcclConnector) and answers the ``kv_transfer_params`` that say where the prompt's KV lies
(``Relay.prefill``); the reservation moves to a decode replica (``Dispatcher.hand_off``), which gets
the client's request with those parameters (``decode_body``) and whose answer ``Relay.attempt``
relays as any other. A prefill failure goes back to the proxy, which retries it on another prefill
replica as any failure before the first byte; a decode replica that fails before its first byte is
replaced by another (the prefill replica keeps the KV until it is pulled); one that fails after it
ends the stream as ``Relay`` ends any. docs/pd.md draws the flow.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson

from kvgate.admission.decision import Refusal
from kvgate.gateway.asgi import Send
from kvgate.gateway.edge.errors import GatewayError, refusal_error
from kvgate.gateway.request_path.forwarding import forwarded_body
from kvgate.gateway.state import GatewayState, ProxyRequest, ReplicaState

if TYPE_CHECKING:
    from kvgate.gateway.request_path.dispatcher import Dispatcher, Route
    from kvgate.gateway.request_path.relay import Relay

Refuse = Callable[[Send, ProxyRequest, GatewayError], Awaitable[None]]

_NOT_FOR_PREFILL = frozenset({"stream_options", "min_tokens", "min_completion_tokens", "kv_transfer_params"})
_PREFILL_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def prefill_body(body: dict[str, Any]) -> bytes:
    """The request as a prefill replica takes it: one token (``max_tokens`` and, when given,
    ``max_completion_tokens`` or a response's ``max_output_tokens``), not streamed, without the
    options a one-token answer cannot honour (``stream_options``, ``min_tokens``), asking its KV
    connector to keep the prompt's KV for a remote decode."""
    prefill = {k: v for k, v in body.items() if k not in _NOT_FOR_PREFILL}
    prefill["max_tokens"] = 1
    for cap in ("max_completion_tokens", "max_output_tokens"):
        if cap in body:
            prefill[cap] = 1
    prefill["stream"] = False
    prefill["kv_transfer_params"] = _PREFILL_PARAMS
    return forwarded_body(prefill)


def decode_body(body: dict[str, Any], params: dict[str, Any]) -> bytes:
    """The request as the decode replica takes it: as the client sent it (capped as priced), with
    the prefill replica's ``kv_transfer_params`` so its connector pulls the KV instead of
    computing it."""
    return forwarded_body({**body, "kv_transfer_params": params})


def handoff_params(body: bytes) -> dict[str, Any] | None:
    """The ``kv_transfer_params`` of a prefill replica's answer; None when it has none."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    params = parsed.get("kv_transfer_params") if isinstance(parsed, dict) else None
    return params if isinstance(params, dict) and params else None


class Handoff:
    def __init__(self, state: GatewayState, relay: Relay, dispatcher: Dispatcher, refuse: Refuse) -> None:
        self._state = state
        self._relay = relay
        self._dispatcher = dispatcher
        self._refuse = refuse

    async def serve(self, request: ProxyRequest, prefill: ReplicaState, send: Send) -> GatewayError | None:
        """Both hops; a prefill failure is returned for the proxy to retry, anything after the
        hand-off is answered here."""
        state = self._state
        state.in_flight += 1
        try:
            prefill.in_flight += 1
            try:
                params = await self._relay.prefill(request, prefill, send)
            finally:
                prefill.in_flight -= 1
            if not isinstance(params, dict):
                return params
            request.prefill_replica = prefill
            request.raw_body = decode_body(request.body, params)
            outcome: Route | Refusal | None = self._dispatcher.hand_off(request)
            failure: GatewayError | None = None
            while outcome is not None and not isinstance(outcome, Refusal):
                decode = outcome.replica
                request.replica = decode
                decode.in_flight += 1
                try:
                    failure = await self._relay.attempt(request, decode, send)
                finally:
                    decode.in_flight -= 1
                if failure is None:
                    return None
                outcome = self._dispatcher.retry_hand_off(request)
            if isinstance(outcome, Refusal):
                self._dispatcher.count_handoff_refusal(request, outcome)
                failure = refusal_error(outcome)
            assert failure is not None
            await self._refuse(send, request, failure)
            return None
        finally:
            state.in_flight -= 1
