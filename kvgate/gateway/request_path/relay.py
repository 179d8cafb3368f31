"""One attempt of a request on one replica, relayed to the client as the replica answers.

``Relay.attempt`` sends the priced body (one write, ``replica_http``) and relays the answer. A
replica's 429 or 5xx before anything reached the client is returned as an error the proxy may retry
elsewhere; after the first byte a failure ends the stream with an error event and ``[DONE]``. A
whole response is read, its usage taken, and sent with its length. A stream's SSE chunks are relayed
as they arrive, never re-assembled into lines or re-serialised; counting ``data:`` events per chunk
is the token count (one event per engine step per sequence carries about one token), reported to
``Accounting`` (a whole response's arrival, which is no first token; a stream's first token,
produced every few events, finished with the inter-token gaps: the moments on the gateway's clock,
the gaps between reads on the event loop's); a Responses stream counts its ``output_text.delta``
events and reads its usage from ``response.completed``. The usage-only chunk the gateway asked for
(``stream_options.include_usage``) is read for the replica's token counts and taken out before the
client sees it. Every answer is passive health for the replica
(``Fleet.observe``).

Where the edge offers a ``RequestEdge`` (``kvgate.gateway.edge.http_protocol.REQUEST_EDGE``), a stream's
chunks are counted and written to the client from the replica connection's read callback
(``ReplicaResponse.divert``): a token then costs no task wake-up, coroutine or ASGI message. Whatever the
writer cannot take at once (the client's socket is full, the client has gone) goes the ASGI way, through the
request's task and ``send``, and so does everything after it until the task caught up, so the client's bytes
keep their order.
"""

from __future__ import annotations

import asyncio
import math
from array import array
from typing import TYPE_CHECKING, Any

import orjson

from kvgate.gateway.asgi import Send
from kvgate.gateway.edge.errors import BadGateway, GatewayError, translate_upstream, upstream_status_error
from kvgate.gateway.edge.request_edge import send_whole
from kvgate.gateway.replicas.fleet import Fleet
from kvgate.gateway.replicas.replica_http import ReplicaClient, ReplicaResponse
from kvgate.gateway.request_path.accounting import Accounting
from kvgate.gateway.request_path.forwarding import NOT_RELAYED, SET_COOKIE, relay_headers
from kvgate.gateway.request_path.handoff import handoff_params, prefill_body
from kvgate.gateway.request_path.surface import RESPONSES_PATH
from kvgate.gateway.state import ProxyRequest, ReplicaState
from kvgate.gateway.telemetry.metrics import GatewayMetrics
from kvgate.vocabulary.clock import Clock

if TYPE_CHECKING:
    from kvgate.gateway.telemetry.tracing import Tracing


_AUTHORIZATION = b"authorization"
_PRODUCED_REPORT_EVENTS = 16
"""The ledger hears a stream's produced-token total once per this many SSE events."""
_USAGE_ONLY = b'"choices":[]'
_CARRY_MAX_BYTES = 1 << 20
"""An unfinished event longer than this is relayed as it is rather than held back."""
_DONE_EVENT = b"data: [DONE]\n\n"
_TOKEN_EVENT = b"data: "
_RESPONSES_DELTA = b'"type":"response.output_text.delta"'
"""A Responses stream's token event: its other events (created, item added, done) carry none."""
_RESPONSES_DONE = b'"type":"response.completed"'
_EVENT_ENDS = (b"\n\n", b"\r\n\r\n")


class Relay:
    def __init__(
        self,
        client: ReplicaClient,
        fleet: Fleet,
        accounting: Accounting,
        metrics: GatewayMetrics,
        clock: Clock,
        forward_client_credentials: bool,
        retry_after_cap_s: float,
        tracing: Tracing | None = None,
    ) -> None:
        self._client = client
        self._fleet = fleet
        self._accounting = accounting
        self._metrics = metrics
        self._clock = clock
        self._tracing = tracing
        self._retry_after_cap_s = retry_after_cap_s
        self._not_relayed = NOT_RELAYED if forward_client_credentials else NOT_RELAYED | {SET_COOKIE}

    async def attempt(self, request: ProxyRequest, replica: ReplicaState, send: Send) -> GatewayError | None:
        """Relay one attempt; a failure before anything reached the client is returned (the caller
        may retry elsewhere), one after it ends the stream with an error event and ``[DONE]``."""
        response: ReplicaResponse | None = None
        replica_url = replica.url
        fleet = self._fleet
        accounting = self._accounting
        upstream_headers = self._upstream_headers(request, replica)
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
                fleet.observe(replica, status, retry_after_s)
                body = await response.read()
                raise upstream_status_error(
                    status, replica.name, replica_url, body, retry_after_s, self._retry_after_cap_s
                )
            headers = relay_headers(response.headers, request.x_request_id, self._not_relayed)
            if not request.stream or status != 200:
                whole = response.body_now()
                body = await response.read() if whole is None else whole
                if status == 200:
                    now_s = self._clock()
                    accounting.answered_whole(request, now_s)
                    _read_usage(request, body)
                request.response_started = True
                self._metrics.count_relayed(status, request.model, request.endpoint, request.tenant)
                request.status = status
                edge = request.edge
                if edge is None or not edge.respond(status, headers, body):
                    await send_whole(send, None, status, headers, body)
                if status == 200:
                    fleet.observe(replica, status)
                    accounting.finished(request, replica, None, self._clock())
                return None
            request.response_started = True
            self._metrics.count_relayed(status, request.model, request.endpoint, request.tenant)
            request.status = status
            await send({"type": "http.response.start", "status": status, "headers": headers})
            itl_s, gaps_s = await self._stream(request, replica, response, send)
            fleet.observe(replica, status)
            accounting.finished(request, replica, itl_s, self._clock(), gaps_s)
            return None
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as exc:
            error = translate_upstream(exc, replica.name, replica_url)
            self._metrics.count_upstream_error(replica, exc)
            if response is None or (response.status < 500 and response.status != 429):
                fleet.observe(replica, None)
            if not request.response_started:
                return error
            request.error = error
            await send(
                {
                    "type": "http.response.body",
                    "body": error.event(),
                }
            )
            return None
        finally:
            if response is not None:
                response.release()

    async def prefill(
        self, request: ProxyRequest, replica: ReplicaState, send: Send
    ) -> dict[str, Any] | GatewayError | None:
        """The first hop of a disaggregated request: the prefill replica computes the prompt's KV
        (``handoff.prefill_body``) and answers the ``kv_transfer_params`` a decode replica needs,
        which are returned. A 429, a 5xx, no answer or an answer without the parameters is returned
        as an error the proxy may retry on another prefill replica; any other answer (a 400 for the
        client's own request) is relayed to the client as it is, and None returned."""
        response: ReplicaResponse | None = None
        started_s = self._clock()
        try:
            response = await self._client.post(
                replica.url,
                request.endpoint,
                prefill_body(request.body),
                self._upstream_headers(request, replica),
                stream=False,
            )
            status = response.status
            body = await response.read()
            if status >= 500 or status == 429:
                retry_after_s = _retry_after_s(response.header(b"retry-after"))
                self._fleet.observe(replica, status, retry_after_s)
                return upstream_status_error(
                    status, replica.name, replica.url, body, retry_after_s, self._retry_after_cap_s
                )
            if status != 200:
                headers = relay_headers(response.headers, request.x_request_id, self._not_relayed)
                request.response_started = True
                request.status = status
                self._metrics.count_relayed(status, request.model, request.endpoint, request.tenant)
                await send_whole(send, request.edge, status, headers, body)
                return None
            params = handoff_params(body)
            if params is None:
                self._fleet.observe(replica, None)
                return BadGateway(f"prefill replica {replica.name} answered without kv_transfer_params")
            self._fleet.observe(replica, status)
            self._fleet.observe_ttft(replica, self._clock() - started_s)
            return params
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as exc:
            self._metrics.count_upstream_error(replica, exc)
            self._fleet.observe(replica, None)
            return translate_upstream(exc, replica.name, replica.url)
        finally:
            if response is not None:
                response.release()

    def _upstream_headers(self, request: ProxyRequest, replica: ReplicaState) -> list[tuple[bytes, bytes]]:
        upstream_headers = request.upstream_headers
        if replica.authorization is not None:
            upstream_headers = [h for h in upstream_headers if h[0] != _AUTHORIZATION]
            upstream_headers.append((_AUTHORIZATION, replica.authorization))
        if self._tracing is not None:
            upstream_headers = self._tracing.upstream(request, replica, upstream_headers)
        return upstream_headers

    async def _stream(
        self,
        request: ProxyRequest,
        replica: ReplicaState,
        response: ReplicaResponse,
        send: Send,
    ) -> tuple[float | None, array[float]]:
        """Relay the stream; returns the mean gap between its token events (inter-token latency)
        and the gap before every read that brought token events after the first. The gaps are
        held for the stream's whole life, so as packed doubles: 8 bytes a token where a list of
        floats holds 32.

        Only whole events are relayed: an event cut across two reads waits (as ``carry``) for the
        read that completes it, so the usage-only event is recognised wherever the replica's
        writes were split. A client cannot act on half an event, so holding one back delays
        nothing it could use; the bytes it receives are unchanged.

        ``sink`` relays what arrives while this task is parked waiting for the replica, and only
        then: a chunk the task holds (its ``send`` waiting for the client's socket to drain, say)
        is never overtaken by one that arrives meanwhile."""
        loop = asyncio.get_running_loop()
        loop_time = loop.time
        count = _StreamCount(request, replica, self._accounting, self._clock)
        take = count.take
        next_chunk = response.next_chunk
        arrival = response.arrival
        edge = request.edge
        parked = False

        def sink(piece: bytes) -> bool:
            if not parked or edge is None or not edge.writable():
                return False
            out = take(piece, loop_time())
            if out:
                edge.write(out)
            return True

        if edge is not None:
            response.divert(sink)
        try:
            while True:
                chunk = next_chunk()
                while chunk is None:
                    parked = True
                    await arrival()
                    parked = False
                    chunk = next_chunk()
                if not chunk:
                    break
                chunk = take(chunk, loop_time())
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if count.carry:
                await send({"type": "http.response.body", "body": count.carry, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            response.divert(None)
        return count.itl_s(), count.gaps_s


class _StreamCount:
    """A stream's tokens as its chunks pass: first token, produced reports, inter-token gaps."""

    __slots__ = (
        "_accounting",
        "_clock",
        "_marker",
        "_replica",
        "_report_at",
        "_request",
        "_strip",
        "carry",
        "events",
        "first_s",
        "gaps_s",
        "last_s",
    )

    def __init__(
        self, request: ProxyRequest, replica: ReplicaState, accounting: Accounting, clock: Clock
    ) -> None:
        self._request = request
        self._replica = replica
        self._accounting = accounting
        self._clock = clock
        self._strip = request.usage_injected
        self._marker = _RESPONSES_DELTA if request.endpoint == RESPONSES_PATH else _TOKEN_EVENT
        self._report_at = _PRODUCED_REPORT_EVENTS
        self.events = 0
        self.first_s = self.last_s = 0.0
        self.gaps_s = array("d")
        self.carry = b""

    def itl_s(self) -> float | None:
        events = self.events
        return (self.last_s - self.first_s) / (events - 1) if events > 1 else None

    def take(self, chunk: bytes, now: float) -> bytes:
        """What of ``chunk`` (read at ``now``) to relay now, its tokens counted."""
        if self.carry:
            chunk = self.carry + chunk
            self.carry = b""
        if not chunk.endswith(_EVENT_ENDS):
            cut = _events_end(chunk)
            if len(chunk) - cut < _CARRY_MAX_BYTES:
                self.carry = chunk[cut:]
                chunk = chunk[:cut]
                if not chunk:
                    return chunk
        marker = self._marker
        count = chunk.count(marker)
        if marker is _RESPONSES_DELTA and _RESPONSES_DONE in chunk:
            _take_responses_usage(self._request, chunk)
        if count:
            tokens = count
            if _USAGE_ONLY in chunk:
                tokens -= 1
                chunk = _take_usage(self._request, chunk, self._strip)
            if chunk.endswith(_DONE_EVENT):
                tokens -= 1
            if tokens > 0:
                events = self.events
                if not events:
                    self.first_s = now
                    self._accounting.first_token(self._request, self._replica, self._clock())
                else:
                    self.gaps_s.append(now - self.last_s)
                events = self.events = events + tokens
                self.last_s = now
                if events >= self._report_at:
                    self._accounting.produced(self._request, events)
                    self._report_at = events + _PRODUCED_REPORT_EVENTS
        return chunk


def _retry_after_s(value: bytes | None) -> float | None:
    try:
        seconds = None if value is None else float(value)
    except ValueError:
        return None
    return seconds if seconds is None or math.isfinite(seconds) else None


def _record_usage(request: ProxyRequest, usage: object) -> None:
    """A replica's token counts: ``prompt_tokens``/``completion_tokens``, or a Responses answer's
    ``input_tokens``/``output_tokens``."""
    if isinstance(usage, dict):
        prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
        completion = usage.get("completion_tokens", usage.get("output_tokens"))
        if isinstance(prompt, int):
            request.prompt_tokens = prompt
        if isinstance(completion, int):
            request.completion_tokens = completion
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(cached := details.get("cached_tokens"), int):
            request.cached_tokens = cached


def _take_responses_usage(request: ProxyRequest, chunk: bytes) -> None:
    """The usage of a Responses stream, from its ``response.completed`` event's response."""
    for event in chunk.split(b"\n\n"):
        if _RESPONSES_DONE in event:
            start = event.find(b"data: ")
            try:
                parsed = orjson.loads(event[start + 6 :]) if start >= 0 else None
            except orjson.JSONDecodeError:
                return
            if isinstance(parsed, dict) and isinstance(parsed.get("response"), dict):
                _record_usage(request, parsed["response"].get("usage"))


def _read_usage(request: ProxyRequest, body: bytes) -> None:
    if b'"usage"' not in body:
        return
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return
    if isinstance(parsed, dict):
        _record_usage(request, parsed.get("usage"))


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
