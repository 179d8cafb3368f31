"""The client side of the HTTP edge: uvicorn's httptools protocol with the limits a server facing
untrusted clients needs, enforced where the bytes arrive, before any request reaches the gateway.

- **Header timeout:** a request's line and headers must all arrive within ``header_timeout_s`` of its
  first byte (of the connection's opening, for its first request), else 408. A new connection that
  sends nothing in that time is closed without an answer (there is no request to answer).
- **Body timeout:** at most ``body_timeout_s`` between two reads of a request body, else 408; the
  application sees ``http.disconnect``. Time while reading is paused on the server's side (the
  application has not taken the body yet, a pipelined request waits) does not count.
- **Header size and count:** raw bytes received before the header section is complete are counted,
  and the parser is never fed more than ``max_header_bytes`` of them, so a huge header is never
  buffered; more than ``max_headers`` fields stops the parser. Both are a 431.
- **Send timeout:** while the transport has paused writing (the client refuses bytes and every buffer
  is full) for ``send_timeout_s``, the connection is aborted; the application sees
  ``http.disconnect`` and the proxy cancels the request upstream. A replica that is slow to answer
  never pauses writing, so a stream slow to start is not cut.
- **Malformed requests:** a request httptools cannot parse is an OpenAI-shaped 400, not logged (a
  client could flood the log).
- **The proxy's hot path:** a request finds its ``RequestEdge`` (``request_edge``) under the
  ``REQUEST_EDGE`` scope extension: a chunk written from a plain call, a whole response in one
  write, a callback when the client goes.
- **The proxied routes without the ASGI dispatch** (``hot_route``): a ``POST`` to one of
  ``HOT_PATHS`` (the URL exactly: no query, no escapes) goes straight to the route the application offers
  (``edge_protocol``'s ``hot_route``), under uvicorn's own request cycle (its ``send``,
  ``receive``, disconnect and keep-alive handling, and its answer to an exception), with a scope of
  just what the route reads: method, path, headers and the ``RequestEdge``. uvicorn's full scope,
  URL parsing and the application's dispatch are skipped. Any other request, a pipelined one
  waiting behind another, or one arriving while the application offers no route (starting,
  draining) takes uvicorn's way.
- **Connection cap:** beyond ``max_connections`` a new connection closes the longest-idle one (no
  request begun on it: NGINX's reusable connections); with none idle it gets a 503 and is closed.
  The cap fits the descriptor limit (``edge_limits``).

Nothing here runs per response chunk but ``RequestEdge``'s check and write: timers are armed per
connection, per request only when its headers or body span reads, and per flow-control pause. The
keep-alive timer too is the connection's, not a response's: uvicorn sets one after each response
and cancels it when the next request begins (~2 µs of CPU a request on uvloop); here it stays set
across requests and, when it fires, closes the connection only if it has been idle for the whole
``timeout_keep_alive`` (otherwise it waits out the rest, or, for a connection busy with a request,
is set again by that request's response).
After a 408 or 431 the connection stops reading, half-closes and lingers ``LINGER_S`` before it is
dropped, so the client reads the answer instead of a reset caused by the bytes it is still sending.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import weakref
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from kvgate.config.server import Server
from kvgate.gateway.edge.edge_limits import EdgeLimits, edge_limits
from kvgate.gateway.edge.errors import (
    BadRequest,
    GatewayError,
    HeadersTooLarge,
    RequestTimeout,
    ServiceUnavailable,
)
from kvgate.gateway.edge.hot_route import HOT_PATHS, HotRoute, no_route, start_hot
from kvgate.gateway.edge.request_edge import REQUEST_EDGE, RequestEdge

logger = logging.getLogger("kvgate.edge")

LINGER_S = 2.0
"""Seconds a refused connection stays half-open (not reading) so its client can read the answer."""
REFUSED_RETRY_AFTER_S = 1.0

_IDLE = 0
_HEADERS = 1
_BODY = 2
_REFUSED = 3


class _Refused(Exception):
    """Raised from a parser callback to stop the parser once the request has been refused."""


def edge_protocol(server: Server, hot_route: HotRoute | None = None) -> type[EdgeProtocol]:
    """The protocol class for one uvicorn server: its limits, its own registry of idle connections
    and the route that serves ``HOT_PATHS``, if any. Raises the descriptor limit and fits the
    connection cap under it."""
    limits = edge_limits(server)

    class BoundEdgeProtocol(EdgeProtocol):
        pass

    BoundEdgeProtocol.limits = limits
    BoundEdgeProtocol.idle = {}
    BoundEdgeProtocol.hot_route = staticmethod(hot_route or no_route)
    return BoundEdgeProtocol


def _rendered(error: GatewayError) -> tuple[bytes, bytes]:
    """Status line and headers (without the closing blank line), and body, of a refusal."""
    body = error.body()
    head = [STATUS_LINE[error.status]]
    for name, value in [*error.headers(), (b"content-length", str(len(body)).encode())]:
        head.append(name + b": " + value + b"\r\n")
    head.append(b"connection: close\r\n")
    return b"".join(head), body


class EdgeProtocol(HttpToolsProtocol):
    __slots__ = (
        "_body_bytes",
        "_body_read_at",
        "_body_since",
        "_header_room",
        "_keep_alive_since",
        "_linger",
        "_max_header_bytes",
        "_max_headers",
        "_phase",
        "_send_timer",
        "_timer",
        "_watched",
    )
    """In slots, so that the instance dict holds only uvicorn's 28 attributes: CPython 3.11 shares an
    instance dict's keys (the fast path of every attribute read in uvicorn's per-request code) up to
    30 of them. The two limits read per request are here too: a slot reads faster than a class
    attribute."""

    limits: ClassVar[EdgeLimits]
    hot_route: ClassVar[HotRoute] = staticmethod(no_route)
    idle: ClassVar[dict[EdgeProtocol, None]]
    """Connections with no request begun on them, longest idle first."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._phase = _IDLE
        self._max_headers = self.limits.max_headers
        self._max_header_bytes = self._header_room = self.limits.max_header_bytes
        self._body_read_at = 0.0
        self._body_since = 0.0
        self._body_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        """The header or the body timer: one phase at a time."""
        self._send_timer: asyncio.TimerHandle | None = None
        self._linger: asyncio.TimerHandle | None = None
        self._keep_alive_since: float | None = None
        """Since when (loop time) the connection has been idle after a response; None while a
        request is under way."""
        self._watched: tuple[weakref.ref[RequestResponseCycle], Callable[[], None]] | None = None
        """The request whose client going is to be told, and how (``RequestEdge.watch``)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limits = self.limits
        if len(self.connections) > limits.max_connections and not self._evict_idle():
            error = ServiceUnavailable(
                f"the gateway is at its limit of {limits.max_connections} client connections",
                retry_after_s=REFUSED_RETRY_AFTER_S,
            )
            self._phase = _REFUSED
            self._write_refusal(error)
            transport.close()
            return
        if limits.send_buffer_bytes:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, limits.send_buffer_bytes)
        self._timer = self.loop.call_later(limits.header_timeout_s, self._on_header_timeout)
        self.idle[self] = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._phase = _REFUSED
        self.idle.pop(self, None)
        for timer in (self._timer, self._send_timer, self._linger, self.timeout_keep_alive_task):
            if timer is not None:
                timer.cancel()
        self._timer = self._send_timer = self._linger = self.timeout_keep_alive_task = None
        super().connection_lost(exc)
        self._tell_disconnected()

    def data_received(self, data: bytes) -> None:
        phase = self._phase
        if phase == _BODY:
            self._body_read_at = self.loop.time()
            self._body_bytes += len(data)
        elif phase == _REFUSED:
            return
        else:
            while self._phase < _BODY and len(data) > self._header_room:
                room = self._header_room
                self._header_room = 0
                if room:
                    self._feed(data[:room])
                    data = data[room:]
                if self._phase == _REFUSED or self.transport.is_closing():
                    return
                if self._phase < _BODY and self._header_room == 0:
                    limit = self._max_header_bytes
                    self._refuse(HeadersTooLarge(f"request line and headers exceed {limit} bytes"))
                    return
            if self._phase < _BODY:
                self._header_room -= len(data)
        self._feed(data)
        if self._timer is None:
            if self._phase == _HEADERS:
                self._timer = self.loop.call_later(self.limits.header_timeout_s, self._on_header_timeout)
            elif self._phase == _BODY:
                self._body_read_at = self._body_since = self.loop.time()
                self._body_bytes = 0
                self._timer = self.loop.call_later(self.limits.body_timeout_s, self._on_body_timeout)

    def _feed(self, data: bytes) -> None:
        """uvicorn's ``data_received``, but the keep-alive timer stops when a request begins (not
        on any byte), a refusal raised by a callback is not a parse error, and a parse error is
        an OpenAI-shaped 400 (uvicorn's is plain text). The server runs without WebSockets
        (``ws="none"``): an Upgrade is ignored, as a server may, without uvicorn's two warnings per
        request (a client could flood the log with them)."""
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass
        except httptools.HttpParserError:
            if self._phase != _REFUSED:
                self._refuse(BadRequest("Invalid HTTP request received."))

    def on_message_begin(self) -> None:
        """uvicorn's, but its scope is built when the headers are complete, only for a request
        that goes uvicorn's way."""
        self._phase = _HEADERS
        self.idle.pop(self, None)
        self._unset_keepalive_if_required()
        self.url = b""
        self.expect_100_continue = False
        self.headers = []

    def on_header(self, name: bytes, value: bytes) -> None:
        """uvicorn's, inlined (it runs per header of every request), with the count limit."""
        headers = self.headers
        if len(headers) >= self._max_headers:
            self._refuse(HeadersTooLarge(f"more than {self._max_headers} request headers"))
            raise _Refused
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._phase = _BODY
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        path = HOT_PATHS.get(self.url)
        if path is not None and (self.cycle is None or self.cycle.response_complete):
            parser = self.parser
            if parser.get_method() == b"POST":
                app = type(self).hot_route()
                if app is not None:
                    start_hot(self, app, path, parser.get_http_version())
                    return
        url, headers, expect_100_continue = self.url, self.headers, self.expect_100_continue
        super().on_message_begin()
        self.url, self.headers, self.expect_100_continue = url, headers, expect_100_continue
        self.scope["headers"] = headers
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:
            self.scope["extensions"] = {REQUEST_EDGE: {"edge": RequestEdge(self, cycle)}}

    def on_message_complete(self) -> None:
        self._phase = _IDLE
        self._header_room = self._max_header_bytes
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().on_message_complete()

    def _unset_keepalive_if_required(self) -> None:
        """A request began: the connection is no longer idle (its keep-alive timer stays set)."""
        self._keep_alive_since = None

    def on_response_complete(self) -> None:
        """uvicorn's, with the connection's own keep-alive timer (see the module's docstring)."""
        self._watched = None
        self._keep_alive_since = None
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._keep_alive_since = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self._on_keep_alive)
        if self._phase == _IDLE:
            self.idle[self] = None

    def _on_keep_alive(self) -> None:
        self.timeout_keep_alive_task = None
        since = self._keep_alive_since
        if since is None:
            return
        left_s = since + self.timeout_keep_alive - self.loop.time()
        if left_s > 0:
            self.timeout_keep_alive_task = self.loop.call_later(left_s, self._on_keep_alive)
            return
        self.timeout_keep_alive_handler()

    def _tell_disconnected(self) -> None:
        """Call the watching request back, once, when it is this connection's latest request
        (the one uvicorn tells) and its client is gone."""
        watched = self._watched
        if watched is not None:
            cycle = watched[0]()
            if cycle is not None and cycle is self.cycle and cycle.disconnected:
                self._watched = None
                watched[1]()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.limits.send_timeout_s, self._on_send_timeout)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _on_header_timeout(self) -> None:
        self._timer = None
        if self._phase == _HEADERS:
            timeout_s = self.limits.header_timeout_s
            self._refuse(RequestTimeout(f"request headers not received within {timeout_s:g} s"))
        elif self._phase == _IDLE:
            self._phase = _REFUSED
            self.idle.pop(self, None)
            self.transport.close()

    def _on_body_timeout(self) -> None:
        timeout_s = self.limits.body_timeout_s
        if self.flow.read_paused:
            self._timer = self.loop.call_later(timeout_s, self._on_body_timeout)
            return
        now = self.loop.time()
        left_s = self._body_read_at + timeout_s - now
        rate = self.limits.body_min_rate_bytes_per_s
        if rate:
            allowed_s = self._body_since + timeout_s + self._body_bytes / rate - now
            if allowed_s <= 0 < left_s:
                self._timer = None
                self._refuse(RequestTimeout(f"request body arrived slower than {rate:g} bytes/s"))
                return
            left_s = min(left_s, allowed_s)
        if left_s > 0:
            self._timer = self.loop.call_later(left_s, self._on_body_timeout)
            return
        self._timer = None
        self._refuse(RequestTimeout(f"no request body received for {timeout_s:g} s"))

    def _on_send_timeout(self) -> None:
        self._send_timer = None
        self.transport.abort()

    @classmethod
    def _evict_idle(cls) -> bool:
        """Close the longest-idle connection to make room; False when none is idle."""
        victim = next(iter(cls.idle), None)
        if victim is None:
            return False
        del cls.idle[victim]
        victim._phase = _REFUSED
        if victim._timer is not None:
            victim._timer.cancel()
            victim._timer = None
        victim.transport.close()
        return True

    @classmethod
    def drain(cls, connections: Iterable[object]) -> None:
        """For a drain: close every idle connection now and every other one once the response in
        progress on it is sent. A request still being read is not cut: the application answers it
        with ``connection: close``."""
        while cls._evict_idle():
            pass
        for connection in connections:
            if isinstance(connection, cls):
                cycle = connection.cycle
                if cycle is not None and not cycle.response_complete:
                    cycle.keep_alive = False

    def _refuse(self, error: GatewayError) -> None:
        """Answer ``error`` in place of the request being read, stop reading and linger. A request
        already answered (a 413 before its body) gets no second answer: the connection closes."""
        reading_body = self._phase == _BODY
        self._phase = _REFUSED
        self.idle.pop(self, None)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            if cycle.response_started:
                self.transport.abort()
                return
            cycle.disconnected = True
            cycle.message_event.set()
            self._tell_disconnected()
        elif cycle is not None and reading_body:
            self.transport.close()
            return
        self._write_refusal(error)
        self.flow.pause_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._linger = self.loop.call_later(LINGER_S, self.transport.abort)

    def _write_refusal(self, error: GatewayError) -> None:
        head, body = _rendered(error)
        defaults = [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
        self.transport.write(b"".join([head, *defaults, b"\r\n", body]))
