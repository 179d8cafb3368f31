"""The hot path: ``POST /v1/chat/completions``, ``POST /v1/completions`` and every other route of
``kvgate.gateway.request_path.surface.PROXIED`` as raw ASGI.

``Proxy._serve`` is the request's life, read top to bottom, each step a call into its owner:
parse (here) → price (``Pricer``) → admit and route (``Dispatcher``, which may queue it) → proxy
(``Relay``, retrying on another replica while nothing reached the client; a generation routed to
a prefill replica goes in two hops, ``kvgate.gateway.request_path.handoff``, while a pooling or
tokenize request is served there whole) → account (``Accounting``, as the answer streams) →
release (``Dispatcher``, once, in ``finally``). A refusal at any step is a value, rendered for the
client by ``errors.refusal_error``.

The client's body bytes are forwarded unchanged (parsed once with orjson, only for what decisions
need), with two documented rewrites, serialised once after pricing: the output cap the gateway
priced is written when the client's body does not already say exactly it
(``kvgate.admission.cost.capped_body``), and a stream whose client did not ask for
``stream_options.include_usage`` gets it, so the replica's own token counts calibrate the estimate.
The client leaving (``http.disconnect``) cancels the request at once: the edge calls back
(``kvgate.gateway.edge.request_edge.RequestEdge.watch``; under another ASGI server a task keeps a
``receive()`` pending instead), and the replica client then closes the upstream connection, which is how vLLM
learns to abort the sequence. Which headers cross, each way, is ``kvgate.gateway.request_path.forwarding``'s.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING, Any

import orjson

from kvgate.admission import refusals
from kvgate.admission.decision import Refusal
from kvgate.config.auth import AuthConfig
from kvgate.config.server import Server
from kvgate.gateway.asgi import Message, Receive, Scope, Send
from kvgate.gateway.edge.errors import (
    BadRequest,
    GatewayError,
    InternalError,
    ModelNotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    refusal_error,
)
from kvgate.gateway.edge.request_edge import REQUEST_EDGE, RequestEdge, send_whole
from kvgate.gateway.replicas.replica_http import ReplicaClient
from kvgate.gateway.request_path.decision_path import DecisionPath
from kvgate.gateway.request_path.dispatcher import Route
from kvgate.gateway.request_path.forwarding import (
    REQUEST_ID_HEADER,
    new_request_id,
    scan_headers,
    upstream_headers,
)
from kvgate.gateway.request_path.handoff import Handoff
from kvgate.gateway.request_path.pricing import Uncounted
from kvgate.gateway.request_path.relay import Relay
from kvgate.gateway.request_path.surface import PROXIED, USAGE_INJECTED
from kvgate.gateway.state import GatewayState, ProxyRequest
from kvgate.vocabulary.replica import Role

if TYPE_CHECKING:
    from kvgate.gateway.telemetry.access_log import AccessLog
    from kvgate.gateway.telemetry.tracing import Tracing


log = logging.getLogger("kvgate.proxy")
_PREFILL = Role.PREFILL


class Proxy:
    def __init__(
        self,
        state: GatewayState,
        path: DecisionPath,
        client: ReplicaClient,
        server: Server,
        auth: AuthConfig,
        retry_after_cap_s: float,
        access_log: AccessLog | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self._state = state
        self._clock = path.clock
        self._pricer = path.pricer
        self._dispatcher = path.dispatcher
        self._metrics = path.metrics
        self._accounting = path.accounting
        self._tenants = path.dispatcher.controller.tenants
        self._admission_config = path.dispatcher.controller.config
        self._fleet = path.fleet
        self._aliases = {alias: name for name, m in state.models.items() for alias in m.aliases}
        """Public names clients may send for a served model (``models[].aliases``)."""
        self._relay = Relay(
            client,
            path.fleet,
            path.accounting,
            path.metrics,
            path.clock,
            auth.forward_client_credentials,
            retry_after_cap_s,
            tracing,
        )
        self._handoff = Handoff(state, self._relay, path.dispatcher, self._refuse)
        self._access_log = access_log
        self._tracing = tracing
        self._max_body_bytes = server.max_body_bytes
        self._forward_credentials = auth.forward_client_credentials
        self.stopping = False
        """Set when the drain time is up: a request cancelled then is ended for the client (a 503,
        or an error event and ``[DONE]`` on a stream already started) instead of being cut."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        started_s = self._clock()
        request_id = new_request_id()
        x_request_id, content_length, forward = scan_headers(scope["headers"])
        x_request_id = x_request_id or request_id
        extensions = scope.get("extensions")
        offered = None if extensions is None else extensions.get(REQUEST_EDGE)
        edge: RequestEdge | None = None if offered is None else offered["edge"]
        try:
            raw = await self._read_body(receive, content_length, edge)
            if raw is None:
                return
            request = self._parse(scope["path"], raw, request_id, x_request_id, forward)
        except GatewayError as exc:
            unread = ProxyRequest(request_id, x_request_id, scope["path"], "", False, {}, b"", forward, [])
            unread.started_s = started_s
            unread.edge = edge
            try:
                await self._refuse(send, unread, exc)
            finally:
                self._done(unread)
            return
        request.started_s = started_s
        watcher = None
        if edge is not None:
            request.edge = edge
            task, edge.task = edge.task or _current_task(), None  # handed over: the edge holds it no longer
            edge.watch(functools.partial(_on_disconnect, request, task))
        else:
            task = _current_task()
            watcher = asyncio.ensure_future(receive())
            watcher.add_done_callback(functools.partial(_on_client_message, request, task))
        try:
            await self._serve(request, send)
        except asyncio.CancelledError:
            if request.disconnected and task.uncancel() == 0:
                return
            if self.stopping and task.uncancel() == 0:
                await _end_at_shutdown(request, send)
                return
            raise
        except Exception:
            # A bug: its reservation was released on the way out; the client still gets an
            # OpenAI-shaped answer, never a traceback or a plain-text 500.
            log.exception("internal error serving request %s", request.request_id)
            await self._fail(send, request)
        finally:
            request.finished = True
            if watcher is not None:
                watcher.cancel()
            self._done(request)

    async def _serve(self, request: ProxyRequest, send: Send) -> None:
        request.arrived_s = self._clock()
        refusal = self._pricer.price_now(request)
        if isinstance(refusal, Uncounted):
            refusal = await self._pricer.count(request, refusal)
        if refusal is None:
            refusal = self._open(request)
        if refusal is not None:
            await self._refuse(send, request, refusal_error(refusal))
            return
        admitted = request.admission
        assert admitted is not None, "priced"
        try:
            outcome = self._dispatcher.admit_now(request)
            if not isinstance(outcome, (Route, Refusal)):
                outcome = await outcome
            if isinstance(outcome, Refusal):
                await self._refuse(send, request, refusal_error(outcome))
                return
            route: Route = outcome
            state = self._state
            try:
                while True:
                    replica = route.replica
                    request.replica = replica
                    if replica.role is _PREFILL and PROXIED[request.endpoint].decodes:
                        failure = await self._handoff.serve(request, replica, send)
                    else:
                        replica.in_flight += 1
                        state.in_flight += 1
                        try:
                            failure = await self._relay.attempt(request, replica, send)
                        finally:
                            replica.in_flight -= 1
                            state.in_flight -= 1
                    if failure is None:
                        return
                    retry = self._dispatcher.retry(request)
                    if retry is None:
                        await self._refuse(send, request, failure)
                        return
                    route = retry
            finally:
                state.served += 1
                self._dispatcher.release(request)
                self._accounting.closed(request, route.replica)
        finally:
            self._tenants.close_request(admitted.tenant)

    def _open(self, request: ProxyRequest) -> Refusal | None:
        """Let a priced request in under its tenant's request limits, or the refusal that says which
        one holds it back (counted as an admission decision). Every request let in is closed once,
        in ``_serve``'s ``finally``."""
        admission = request.admission
        assert admission is not None, "priced"
        tenant = admission.tenant
        limit = self._tenants.open_request(tenant, request.arrived_s)
        if limit is None:
            return None
        refusal = refusals.over_request_limit(tenant, limit, self._admission_config)
        pool = self._fleet.pool_of(request.model)
        self._metrics.count_decision("reject", refusal.reason.value, pool=pool, model=request.model)
        return refusal

    def _done(self, request: ProxyRequest) -> None:
        """Record the finished request, once: its spans and its access-log line."""
        now_s = self._clock()
        if self._tracing is not None:
            self._tracing.finish(request, now_s)
        if self._access_log is not None:
            self._access_log.write(request, now_s)

    async def _fail(self, send: Send, request: ProxyRequest) -> None:
        error = InternalError("internal gateway error")
        if not request.response_started:
            await self._refuse(send, request, error)
        elif request.stream:
            request.error = error
            await send({"type": "http.response.body", "body": error.event()})

    async def _refuse(self, send: Send, request: ProxyRequest, error: GatewayError) -> None:
        """Answer ``request`` with ``error``: counted, kept for its record, rendered."""
        self._metrics.count_error(error, request.model, request.endpoint, request.tenant)
        request.status = error.status
        request.error = error
        await send_error(send, error, request.x_request_id, request.edge)

    async def _read_body(
        self, receive: Receive, content_length: int | None, edge: RequestEdge | None
    ) -> bytes | None:
        """The whole request body, or None if the client left while sending it. A body the edge
        already holds whole is taken from it, with no ``receive()``."""
        limit = self._max_body_bytes
        if content_length is not None and content_length > limit:
            raise PayloadTooLarge(
                f"request body of {content_length} bytes exceeds the limit of {limit} bytes"
            )
        held = None if edge is None else edge.body()
        if held is not None:
            if len(held) > limit:
                raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
            return held
        message = await receive()
        if message["type"] != "http.request":
            return None
        body: bytes = message.get("body", b"")
        if not message.get("more_body", False):
            if len(body) > limit:
                raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
            return body
        parts = [body]
        size = len(body)
        while message.get("more_body", False):
            message = await receive()
            if message["type"] != "http.request":
                return None
            part = message.get("body", b"")
            size += len(part)
            if size > limit:
                raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
            parts.append(part)
        return b"".join(parts)

    def _parse(
        self,
        endpoint: str,
        raw: bytes,
        request_id: str,
        x_request_id: str,
        forward: list[tuple[bytes, bytes]],
    ) -> ProxyRequest:
        """The request as decisions need it. A stream gets ``include_usage`` in its parsed body only:
        the body is serialised again once, after pricing (``Pricer``), with the output cap priced."""
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str):
            raise BadRequest("`model` is required and must be a string", param="model")
        if model not in self._state.models:
            served = self._aliases.get(model)
            if served is None:
                raise ModelNotFound(model)
            model = body["model"] = served
            raw = orjson.dumps(body)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise BadRequest("`stream` must be a boolean", param="stream")
        headers = upstream_headers(forward, x_request_id, self._forward_credentials)
        injected = False
        if stream and endpoint in USAGE_INJECTED:
            options = body.get("stream_options")
            if not isinstance(options, dict) or options.get("include_usage") is not True:
                body["stream_options"] = {
                    **(options if isinstance(options, dict) else {}),
                    "include_usage": True,
                }
                injected = True
        return ProxyRequest(
            request_id=request_id,
            x_request_id=x_request_id,
            endpoint=endpoint,
            model=model,
            stream=stream,
            body=body,
            raw_body=raw,
            headers=forward,
            upstream_headers=headers,
            usage_injected=injected,
        )


def _on_client_message(
    request: ProxyRequest, task: asyncio.Task[Any], watcher: asyncio.Future[Message]
) -> None:
    if request.finished or watcher.cancelled() or watcher.exception() is not None:
        return
    if watcher.result()["type"] == "http.disconnect":
        _on_disconnect(request, task)


def _current_task() -> asyncio.Task[Any]:
    task = asyncio.current_task()
    assert task is not None
    return task


def _on_disconnect(request: ProxyRequest, task: asyncio.Task[Any]) -> None:
    if not request.finished:
        request.disconnected = True
        task.cancel()


def shutting_down() -> ServiceUnavailable:
    return ServiceUnavailable(
        "this gateway is shutting down; retry the request", retry_after_s=1.0, reason="draining"
    )


async def _end_at_shutdown(request: ProxyRequest, send: Send) -> None:
    error = shutting_down()
    request.error = error
    if not request.response_started:
        request.status = error.status
        await send_error(send, error, request.x_request_id)
    elif request.stream:
        event = error.event()
        await send({"type": "http.response.body", "body": event})


async def send_error(
    send: Send, error: GatewayError, request_id: str, edge: RequestEdge | None = None
) -> None:
    headers = error.headers()
    headers.append((REQUEST_ID_HEADER, request_id.encode()))
    await send_whole(send, edge, error.status, headers, error.body())
