"""The hot path: ``POST /v1/chat/completions`` and ``POST /v1/completions`` as raw ASGI.

parse → ``decide`` → proxy (retrying on another replica while nothing reached the client) →
``finally`` release, once. The client's body bytes are forwarded unchanged (parsed once with
orjson, only for what decisions need), with two documented rewrites, serialised once after
pricing: the output cap the gateway priced is written when the client's body does not already say
exactly it (``admission.cost.capped_body``), and a stream whose client did not ask for
``stream_options.include_usage`` gets it, so the replica's own token counts calibrate the
estimate, and the usage-only chunk it brings is taken out before the client sees it. SSE chunks are
relayed as they arrive, never re-assembled into lines or re-serialised; counting ``data:`` events
per chunk is the token count (one event per engine step per sequence carries about one token).
A watcher on ``receive`` notices the client leaving (``http.disconnect``) and cancels the request
at once: the replica client then closes the upstream connection, which is how vLLM learns to abort
the sequence. Connect, first-byte and idle timeouts are the replica client's (``replica_http``).
Upstream failures become gateway errors in ``errors.translate_upstream``; replica 4xx bodies pass
through as written. Headers: hop-by-hop ones (RFC 9110 section 7.6.1, and any a replica's
``Connection`` names) go neither way; the client's ``Authorization`` and ``Cookie`` reach replicas
and a replica's ``Set-Cookie`` reaches the client only under ``server.forward_client_credentials``
(the decider strips the client's; a pool's ``api_key`` replaces ``Authorization`` per attempt).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import orjson

from config.schema import Server
from gateway.decide import KvgateDecider, Refusal, Route
from gateway.errors import (
    BadRequest,
    GatewayError,
    InternalError,
    ModelNotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    translate_upstream,
    upstream_status_error,
)
from gateway.replica_http import ReplicaClient, ReplicaResponse
from gateway.state import GatewayState, ProxyRequest, ReplicaState

if TYPE_CHECKING:
    from gateway.access_log import AccessLog
    from gateway.tracing import Tracing

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

log = logging.getLogger("kvgate.proxy")
REQUEST_ID_HEADER = b"x-request-id"
_CLIENT_REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,128}")
"""A client's ``X-Request-Id`` that is echoed and forwarded: 1 to 128 visible ASCII characters."""
_NOT_FORWARDED = frozenset(
    {
        b"host",
        b"connection",
        b"keep-alive",
        b"content-length",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"proxy-connection",
        b"proxy-authorization",
        b"expect",
        REQUEST_ID_HEADER,
    }
)
_PLAIN_CONNECTION = frozenset({b"keep-alive", b"close"})
"""Connection options that name no header: nothing more to drop for them."""
_NOT_RELAYED = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"content-length",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"proxy-connection",
        b"proxy-authenticate",
        b"date",
        b"server",
        REQUEST_ID_HEADER,
    }
)
_SET_COOKIE = b"set-cookie"
_AUTHORIZATION = b"authorization"
_PRODUCED_REPORT_EVENTS = 16
"""The ledger hears a stream's produced-token total once per this many SSE events."""
_USAGE_ONLY = b'"choices":[]'
_CARRY_MAX_BYTES = 1 << 20
"""An unfinished event longer than this is relayed as it is rather than held back."""
_DONE_EVENT = b"data: [DONE]\n\n"
_EVENT_ENDS = (b"\n\n", b"\r\n\r\n")


class Proxy:
    def __init__(
        self,
        state: GatewayState,
        decider: KvgateDecider,
        client: ReplicaClient,
        server: Server,
        access_log: AccessLog | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self._state = state
        self._decider = decider
        self._metrics = decider.metrics
        self._client = client
        self._access_log = access_log
        self._tracing = tracing
        self._max_body_bytes = server.max_body_bytes
        self._not_relayed = (
            _NOT_RELAYED if server.forward_client_credentials else _NOT_RELAYED | {_SET_COOKIE}
        )
        self.stopping = False
        """Set when the drain time is up: a request cancelled then is ended for the client (a 503,
        or an error event and ``[DONE]`` on a stream already started) instead of being cut."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        started_s = time.monotonic()
        request_id = os.urandom(16).hex()
        x_request_id, content_length, forward = _scan_headers(scope["headers"])
        x_request_id = x_request_id or request_id
        try:
            raw = await self._read_body(receive, content_length)
            if raw is None:
                return
            request = self._parse(scope["path"], raw, request_id, x_request_id, forward)
        except GatewayError as exc:
            unread = ProxyRequest(request_id, x_request_id, scope["path"], "", False, {}, b"", forward, [])
            unread.started_s = started_s
            try:
                await self._refuse(send, unread, exc)
            finally:
                self._done(unread)
            return
        request.started_s = started_s
        task = asyncio.current_task()
        assert task is not None
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
            watcher.cancel()
            self._done(request)

    def _done(self, request: ProxyRequest) -> None:
        """Record the finished request, once: its spans and its access-log line."""
        now_s = time.monotonic()
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
            await send({"type": "http.response.body", "body": _error_event(error)})

    async def _refuse(self, send: Send, request: ProxyRequest, error: GatewayError) -> None:
        """Answer ``request`` with ``error``: counted, kept for its record, rendered."""
        self._metrics.count_error(error)
        request.status = error.status
        request.error = error
        await send_error(send, error, request.x_request_id)

    async def _serve(self, request: ProxyRequest, send: Send) -> None:
        outcome = await self._decider.decide(request)
        if isinstance(outcome, Refusal):
            await self._refuse(send, request, outcome.error)
            return
        route: Route = outcome
        state = self._state
        try:
            while True:
                replica = route.replica
                request.replica = replica
                replica.in_flight += 1
                state.in_flight += 1
                try:
                    failure = await self._relay(request, replica, send)
                finally:
                    replica.in_flight -= 1
                    state.in_flight -= 1
                if failure is None:
                    return
                retry = self._decider.retry(request, failure)
                if retry is None:
                    await self._refuse(send, request, failure)
                    return
                route = retry
        finally:
            state.served += 1
            self._decider.release(request, route)

    async def _relay(self, request: ProxyRequest, replica: ReplicaState, send: Send) -> GatewayError | None:
        """Relay one attempt; a failure before anything reached the client is returned (the caller
        may retry elsewhere), one after it ends the stream with an error event and ``[DONE]``."""
        response: ReplicaResponse | None = None
        replica_url = replica.url
        decider = self._decider
        upstream_headers = request.upstream_headers
        if replica.authorization is not None:
            upstream_headers = [h for h in upstream_headers if h[0] != _AUTHORIZATION]
            upstream_headers.append((_AUTHORIZATION, replica.authorization))
        if self._tracing is not None:
            upstream_headers = self._tracing.upstream(request, replica, upstream_headers)
        try:
            response = await self._client.post(
                replica_url,
                request.endpoint,
                request.raw_body,
                upstream_headers,
                stream=request.stream,
            )
            status = response.status
            if status >= 500 or status == 429:
                retry_after_s = _retry_after_s(response.header(b"retry-after"))
                decider.observe(replica, status, retry_after_s)
                body = await response.read()
                raise upstream_status_error(status, replica.name, replica_url, body, retry_after_s)
            headers = _relay_headers(response.headers, request.x_request_id, self._not_relayed)
            if not request.stream or status != 200:
                body = await response.read()
                if status == 200:
                    now_s = time.monotonic()
                    decider.first_token(request, replica, now_s)
                    _read_usage(request, body)
                headers.append((b"content-length", str(len(body)).encode()))
                request.response_started = True
                self._metrics.count_relayed(status)
                request.status = status
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                if status == 200:
                    decider.observe(replica, status)
                    decider.finished(request, replica, None, time.monotonic())
                return None
            request.response_started = True
            self._metrics.count_relayed(status)
            request.status = status
            await send({"type": "http.response.start", "status": status, "headers": headers})
            itl_s, gaps_s = await self._stream(request, replica, response, send)
            decider.observe(replica, status)
            decider.finished(request, replica, itl_s, time.monotonic(), gaps_s)
            return None
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as exc:
            error = translate_upstream(exc, replica.name, replica_url)
            self._metrics.count_upstream_error(replica, exc)
            if response is None or (response.status < 500 and response.status != 429):
                decider.observe(replica, None)
            if not request.response_started:
                return error
            request.error = error
            await send(
                {
                    "type": "http.response.body",
                    "body": _error_event(error),
                }
            )
            return None
        finally:
            if response is not None:
                response.release()

    async def _stream(
        self,
        request: ProxyRequest,
        replica: ReplicaState,
        response: ReplicaResponse,
        send: Send,
    ) -> tuple[float | None, list[float]]:
        """Relay the stream; returns the mean gap between its token events (inter-token latency)
        and the gap before every read that brought token events after the first.

        Only whole events are relayed: an event cut across two reads waits (as ``carry``) for the
        read that completes it, so the usage-only event is recognised wherever the replica's
        writes were split. A client cannot act on half an event, so holding one back delays
        nothing it could use; the bytes it receives are unchanged."""
        loop = asyncio.get_running_loop()
        events = 0
        first_s = last_s = 0.0
        gaps_s: list[float] = []
        report_at = _PRODUCED_REPORT_EVENTS
        strip = request.usage_injected
        decider = self._decider
        carry = b""
        while True:
            chunk = await response.read_chunk()
            if not chunk:
                break
            now = loop.time()
            if carry:
                chunk = carry + chunk
                carry = b""
            if not chunk.endswith(_EVENT_ENDS):
                cut = _events_end(chunk)
                if len(chunk) - cut < _CARRY_MAX_BYTES:
                    carry = chunk[cut:]
                    chunk = chunk[:cut]
                    if not chunk:
                        continue
            count = chunk.count(b"data: ")
            if count:
                tokens = count
                if _USAGE_ONLY in chunk:
                    tokens -= 1
                    chunk = _take_usage(request, chunk, strip)
                if chunk.endswith(_DONE_EVENT):
                    tokens -= 1
                if tokens > 0:
                    if not events:
                        first_s = now
                        decider.first_token(request, replica, time.monotonic())
                    else:
                        gaps_s.append(now - last_s)
                    events += tokens
                    last_s = now
                    if events >= report_at:
                        decider.produced(request, events)
                        report_at = events + _PRODUCED_REPORT_EVENTS
                if not chunk:
                    continue
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        if carry:
            await send({"type": "http.response.body", "body": carry, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return ((last_s - first_s) / (events - 1) if events > 1 else None), gaps_s

    async def _read_body(self, receive: Receive, content_length: int | None) -> bytes | None:
        """The whole request body, or None if the client left while sending it."""
        limit = self._max_body_bytes
        if content_length is not None and content_length > limit:
            raise PayloadTooLarge(
                f"request body of {content_length} bytes exceeds the limit of {limit} bytes"
            )
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
        the body is serialised again once, after pricing (``decide``), with the output cap priced."""
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
            raise ModelNotFound(model)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise BadRequest("`stream` must be a boolean", param="stream")
        headers = [*forward, (REQUEST_ID_HEADER, x_request_id.encode())]
        injected = False
        if stream:
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


def _retry_after_s(value: bytes | None) -> float | None:
    try:
        return None if value is None else float(value)
    except ValueError:
        return None


def _record_usage(request: ProxyRequest, usage: object) -> None:
    if isinstance(usage, dict):
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(prompt, int):
            request.prompt_tokens = prompt
        if isinstance(completion, int):
            request.completion_tokens = completion


def _read_usage(request: ProxyRequest, body: bytes) -> None:
    if b'"usage"' not in body:
        return
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return
    if isinstance(parsed, dict):
        _record_usage(request, parsed.get("usage"))


def _error_event(error: GatewayError) -> bytes:
    """How a stream that already started ends on an error: the error as an event, then ``[DONE]``."""
    return b"data: " + error.body() + b"\n\n" + _DONE_EVENT


def _events_end(chunk: bytes) -> int:
    """Where the last whole SSE event in ``chunk`` ends (a blank line, LF or CRLF); 0 when none does."""
    lf = chunk.rfind(b"\n\n")
    crlf = chunk.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


def _take_usage(request: ProxyRequest, chunk: bytes, strip: bool) -> bytes:
    """Read the usage-only event in ``chunk``; without it when the gateway asked for it."""
    kept = []
    for event in chunk.split(b"\n\n"):
        if _USAGE_ONLY in event and event.startswith(b"data: "):
            try:
                parsed = orjson.loads(event[6:])
            except orjson.JSONDecodeError:
                parsed = None
            if isinstance(parsed, dict):
                _record_usage(request, parsed.get("usage"))
                if strip:
                    continue
        kept.append(event)
    return b"\n\n".join(kept)


def _on_client_message(
    request: ProxyRequest, task: asyncio.Task[Any], watcher: asyncio.Future[Message]
) -> None:
    if request.finished or watcher.cancelled() or watcher.exception() is not None:
        return
    if watcher.result()["type"] == "http.disconnect":
        request.disconnected = True
        task.cancel()


def _scan_headers(raw: list[tuple[bytes, bytes]]) -> tuple[str, int | None, list[tuple[bytes, bytes]]]:
    """The client's usable ``X-Request-Id`` ("" when absent or unusable), the declared body length,
    and the headers to forward."""
    x_request_id = ""
    content_length: int | None = None
    connection = None
    forward = []
    for name, value in raw:
        if name == REQUEST_ID_HEADER:
            x_request_id = _client_request_id(value)
        elif name == b"content-length":
            content_length = int(value) if value.isdigit() else None
        elif name not in _NOT_FORWARDED:
            forward.append((name, value))
        elif name == b"connection":
            connection = value
    if connection is not None:
        named = {token.strip().lower() for token in connection.split(b",")} - _PLAIN_CONNECTION
        if named:
            # Headers the client's Connection names are hop-by-hop (RFC 9110 section 7.6.1).
            forward = [header for header in forward if header[0] not in named]
    return x_request_id, content_length, forward


def _client_request_id(value: bytes) -> str:
    """The client's id when it may be echoed, logged and forwarded as it is; "" otherwise."""
    return value.decode() if _CLIENT_REQUEST_ID.fullmatch(value) else ""


def request_id_of(scope: Scope) -> str:
    """The ``X-Request-Id`` to answer with: the client's when usable, or a new random one."""
    for name, value in scope["headers"]:
        if name == REQUEST_ID_HEADER:
            return _client_request_id(value) or os.urandom(16).hex()
    return os.urandom(16).hex()


def _relay_headers(
    raw: list[tuple[bytes, bytes]], request_id: str, not_relayed: frozenset[bytes]
) -> list[tuple[bytes, bytes]]:
    """The replica's headers the client gets: without ``not_relayed`` ones and any the replica's
    ``Connection`` header names as hop-by-hop."""
    headers = []
    connection = None
    for name, value in raw:
        low = name.lower()
        if low not in not_relayed:
            headers.append((low, value))
        elif low == b"connection":
            connection = value
    if connection is not None:
        named = {token.strip().lower() for token in connection.split(b",")}
        headers = [header for header in headers if header[0] not in named]
    headers.append((REQUEST_ID_HEADER, request_id.encode()))
    return headers


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
        event = _error_event(error)
        await send({"type": "http.response.body", "body": event})


async def send_error(send: Send, error: GatewayError, request_id: str) -> None:
    body = error.body()
    headers = error.headers()
    headers.append((b"content-length", str(len(body)).encode()))
    headers.append((REQUEST_ID_HEADER, request_id.encode()))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
