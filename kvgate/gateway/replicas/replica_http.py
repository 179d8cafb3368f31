"""The completion routes' HTTP/1.1 client to replicas: pooled keep-alive connections, httptools.

Why not the shared aiohttp session here: on this project's 2-core machine aiohttp 3.14 on Python
3.11 costs 81-87 µs of CPU per request as a client (a task per request body, header multidicts, a
timer and a response object graph), a third of the gateway's 250 µs budget; this client costs
17-18 µs for the same work (``python -m bench.bench_proxy --client 20000``). It does only what
the two completion routes need: ``POST`` with a body in one write, the response's status and raw
headers, and the body as it arrives. aiohttp still serves every other upstream call (health
probes, ``/metrics`` scrapes, ``/tokenize``).

Timeouts live on the connection, not around the caller: one timer per connection, kept across its
requests and moved only when it fires early (to the deadline then in force) or a deadline comes
before it, so neither a request nor a streamed chunk costs a timer of its own (a timer set and
cancelled costs ~2 µs of CPU on uvloop), only a clock read. Until the
response's first body byte the deadline is ``first_byte_s`` after the request was written (a whole
non-streamed generation); after it, a streamed response may be silent for at most ``idle_s``
between chunks. A connection whose reader is paused (the client is slower than the replica) is
never timed out for idleness: the silence is the gateway's.

Closing the connection is how a replica learns a request was abandoned (vLLM aborts the sequence
when its client goes away), so a response that is not read to its end is never returned to the pool.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import httptools
from mypy_extensions import mypyc_attr
from yarl import URL

_TARGET_CACHE_SIZE = 4096
_HIGH_WATER_BYTES = 256 * 1024
"""Buffered body bytes above which the connection stops reading until the relay catches up."""

Headers = list[tuple[bytes, bytes]]


@mypyc_attr(native_class=False)
class ReplicaHTTPError(Exception):
    """A failure talking to a replica; ``kvgate.gateway.edge.errors.translate_upstream`` maps it for the
    client.

    These stay ordinary classes when the module is compiled (setup.py): ``ReplicaTimeout`` is also
    a ``TimeoutError``, and a compiled class cannot have two built-in bases."""


@mypyc_attr(native_class=False)
class ReplicaConnectError(ReplicaHTTPError):
    """No connection could be opened."""

    def __init__(self, os_error: OSError) -> None:
        super().__init__(os_error.strerror or str(os_error) or type(os_error).__name__)
        self.os_error = os_error


@mypyc_attr(native_class=False)
class ReplicaDisconnected(ReplicaHTTPError):
    """The replica closed the connection before its response was complete."""


@mypyc_attr(native_class=False)
class ReplicaProtocolError(ReplicaHTTPError):
    """The replica's answer was not valid HTTP/1.1."""


@mypyc_attr(native_class=False)
class ReplicaTimeout(ReplicaHTTPError, TimeoutError):
    """Connecting, the first byte or the next streamed chunk took longer than configured."""


@dataclass(frozen=True, slots=True)
class Origin:
    scheme: str
    host: str
    port: int

    @classmethod
    def of(cls, url: URL) -> Origin:
        if url.scheme not in ("http", "https") or not url.host or url.port is None:
            raise ValueError(f"replica URL must be http(s)://host[:port][/path], got {str(url)!r}")
        return cls(url.scheme, url.host, url.port)

    def host_header(self) -> bytes:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return (host if self.port == default else f"{host}:{self.port}").encode("idna")


class _Connection(asyncio.Protocol):
    """One keep-alive connection; it parses one response at a time."""

    def __init__(self, client: ReplicaClient, origin: Origin) -> None:
        self._client = client
        self.origin = origin
        self._loop = client.loop
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        """When ``_timer`` fires (loop time)."""
        self.sink: Callable[[bytes], bool] | None = None
        """``ReplicaResponse.divert``'s callback."""
        self._reset()

    def _reset(self) -> None:
        self.active = False
        self.status = 0
        self.headers: Headers = []
        self.headers_done = False
        self.complete = False
        self.error: BaseException | None = None
        self.received_any = False
        self.body: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._stream = False
        self._body_seen = False
        self._first_byte_at = 0.0
        self._last_body_at = 0.0
        self._length_known = False
        self._keep_alive = False
        self.sink = None

    # -- request side -------------------------------------------------------------------------

    def start(self, request: bytes, stream: bool) -> None:
        """Write one whole request and arm the first-byte deadline."""
        assert self.transport is not None
        self._reset()
        self.active = True
        self._stream = stream
        now = self._loop.time()
        self._first_byte_at = now + self._client.first_byte_s
        self._arm(self._first_byte_at)
        self.transport.write(request)

    def wait(self) -> asyncio.Future[None]:
        """A future resolved when the protocol has news (headers, body, completion, an error).
        Awaited as it is, not through a coroutine: a streamed chunk costs one frame fewer."""
        waiter = self._waiter = self._loop.create_future()
        return waiter

    def next_chunk(self) -> bytes | None:
        """The body bytes that have arrived; ``b""`` once the body is complete, None while nothing
        has arrived yet (await ``wait()``)."""
        body = self.body
        if not body:
            if self.error is not None:
                raise self.error
            return b"" if self.complete else None
        data = body.popleft() if len(body) == 1 else b"".join(body)
        body.clear()
        self._buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    def close(self) -> None:
        self._cancel_timer()
        self._client.forget(self)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if not self.active:
            self.close()
            return
        self.received_any = True
        body = self.body
        unread = len(body)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ReplicaProtocolError(f"invalid response: {exc}"))
            self.close()
            return
        if len(body) == unread:
            return
        sink = self.sink
        if sink is not None and not unread:
            try:
                taken = sink(body[0] if len(body) == 1 else b"".join(body))
            except Exception as exc:
                taken = True
                self._fail(exc)
            if taken:
                body.clear()
                self._buffered = 0
                if self._paused and self.transport is not None:
                    self._paused = False
                    self.transport.resume_reading()
                return
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self._client.forget(self)
        if self.active and not self.complete:
            if self.headers_done and not self._length_known:
                self.on_message_complete()
            else:
                self._fail(ReplicaDisconnected("the replica closed the connection mid-response"))

    # -- httptools callbacks ------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        lowered = {name.lower() for name, _ in self.headers}
        self._length_known = b"content-length" in lowered or b"transfer-encoding" in lowered
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self._stream:
            self._last_body_at = now = self._loop.time()
            if not self._body_seen:
                self._arm(now + self._client.idle_s)
        self._body_seen = True
        self.body.append(body)
        buffered = self._buffered = self._buffered + len(body)
        if buffered > _HIGH_WATER_BYTES and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        # llhttp answers this only inside the callbacks; afterwards it reports False
        self._keep_alive = self._parser.should_keep_alive()
        self.complete = True
        self._wake()

    # -- internals ----------------------------------------------------------------------------

    def reusable(self) -> bool:
        return (
            self.complete
            and self.error is None
            and self.transport is not None
            and not self.transport.is_closing()
            and self._keep_alive
            and not self._paused  # left unread while reading was stopped: not worth resuming
        )

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self._cancel_timer()
        self._wake()

    def _arm(self, when: float) -> None:
        """Have the timer fire by ``when``: a pending one that fires no later stays (it moves on
        to the deadline in force when it fires)."""
        if self._timer is not None:
            if self._timer_at <= when:
                return
            self._timer.cancel()
        self._timer_at = when
        self._timer = self._loop.call_at(when, self._on_timer)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self) -> None:
        self._timer = None
        if not self.active or self.complete or self.error is not None:
            return
        now = self._loop.time()
        if self._stream and self._body_seen:
            if self._paused:
                self._arm(now + self._client.idle_s)
                return
            deadline = self._last_body_at + self._client.idle_s
            what = f"no chunk for {self._client.idle_s:g} s"
        else:
            deadline = self._first_byte_at
            what = f"no answer within {self._client.first_byte_s:g} s"
        if now < deadline:
            self._arm(deadline)
            return
        self._fail(ReplicaTimeout(what))
        self.close()


class ReplicaResponse:
    """A replica's answer: status and raw headers at once, the body as it comes.

    ``next_chunk`` and ``arrival`` are the connection's own methods, bound once: a stream's relay
    loop calls them per chunk (``chunk = next_chunk()``, and while it is None, ``await arrival()``),
    a Python call each and no coroutine, where ``read_chunk`` is the convenient form. ``divert``
    goes further: the body pieces of one read are handed to a callback at once, from the
    connection's own read callback, and only those it declines are kept for reading."""

    __slots__ = ("_client", "_connection", "arrival", "headers", "next_chunk", "status")

    def __init__(self, client: ReplicaClient, connection: _Connection) -> None:
        self._client = client
        self._connection = connection
        self.status = connection.status
        self.headers = connection.headers
        self.next_chunk: Callable[[], bytes | None] = connection.next_chunk
        """Whatever body bytes have arrived; ``b""`` once the body is complete, None while
        nothing has arrived yet."""
        self.arrival: Callable[[], asyncio.Future[None]] = connection.wait
        """A future resolved when more of the response arrives, it completes or it fails."""

    def header(self, name: bytes) -> bytes | None:
        """The first value of a header (``name`` in lower case)."""
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    def divert(self, sink: Callable[[bytes], bool] | None) -> None:
        """Offer the body bytes of each read, joined, to ``sink`` while none are waiting to be read:
        bytes it answers True for are taken (never read here; the reader is not woken), bytes it
        answers False for are kept for ``next_chunk`` as any other. An exception it raises is
        the response's error, raised to the reader. None stops it."""
        self._connection.sink = sink

    async def read_chunk(self) -> bytes:
        """Whatever body bytes have arrived (waiting for some); ``b""`` once the body is complete."""
        connection = self._connection
        chunk = connection.next_chunk()
        while chunk is None:
            await connection.wait()
            chunk = connection.next_chunk()
        return chunk

    def body_now(self) -> bytes | None:
        """The whole body when all of it has arrived (a plain call, no coroutine); None otherwise:
        ``await read()``."""
        connection = self._connection
        if not connection.complete or connection.error is not None:
            return None
        return connection.next_chunk()

    async def read(self) -> bytes:
        """The whole body. What has arrived is taken as it comes, so flow control never stops the
        connection short of a body larger than the high-water mark."""
        connection = self._connection
        parts: list[bytes] = []
        while True:
            chunk = connection.next_chunk()
            if chunk is None:
                await connection.wait()
            elif chunk:
                parts.append(chunk)
            else:
                return parts[0] if len(parts) == 1 else b"".join(parts)

    def release(self) -> None:
        """Back to the pool when read to its end, otherwise closed (the replica sees the abort)."""
        self._client.release(self._connection)


class ReplicaClient:
    """Keep-alive pools per replica origin, at most ``limit`` connections in all."""

    def __init__(
        self,
        *,
        connect_s: float,
        first_byte_s: float,
        idle_s: float,
        keepalive_s: float,
        limit: int,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.connect_s = connect_s
        self.first_byte_s = first_byte_s
        self.idle_s = idle_s
        self._keepalive_s = keepalive_s
        self._limit = limit
        self._idle: dict[Origin, list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._targets: dict[str, tuple[Origin, bytes]] = {}
        self._ssl: ssl.SSLContext | None = None
        self._closed = False

    @property
    def open_connections(self) -> int:
        return len(self._open)

    async def post(
        self, base_url: str, path: str, body: bytes, headers: Headers, *, stream: bool
    ) -> ReplicaResponse:
        """Send ``POST base_url+path`` and wait for the response's status and headers.

        A pooled connection the replica closed while it sat idle fails before any response byte;
        the request then goes once more on a new connection (nothing reached the replica's
        application, so nothing is generated twice)."""
        target = self._targets.get(base_url + path)
        if target is None:
            target = self._target(base_url + path)
        origin, request_line = target
        head = [request_line, b"content-length: %d\r\n" % len(body)]
        for name, value in headers:
            head += (name, b": ", value, b"\r\n")
        head += (b"\r\n", body)
        request = b"".join(head)
        while True:
            # A pooled connection is taken as a plain call; only opening one or waiting for one to
            # come free is awaited.
            pooled = None if self._closed else self._pooled(origin)
            if pooled is not None:
                connection, reused = pooled, True
            else:
                connection, reused = await self._acquire(origin)
            try:
                connection.start(request, stream)
                while not connection.headers_done:
                    if connection.error is not None:
                        raise connection.error
                    await connection.wait()
            except ReplicaDisconnected:
                connection.close()
                if reused and not connection.received_any:
                    continue
                raise
            except BaseException:
                connection.close()
                raise
            return ReplicaResponse(self, connection)

    def _target(self, url: str) -> tuple[Origin, bytes]:
        """The origin to connect to and the request's first two lines (request line and ``host``)."""
        if len(self._targets) >= _TARGET_CACHE_SIZE:
            self._targets.clear()
        parsed = URL(url)
        origin = Origin.of(parsed)
        request_line = b"POST %s HTTP/1.1\r\nhost: %s\r\n" % (
            parsed.raw_path_qs.encode(),
            origin.host_header(),
        )
        target = self._targets[url] = (origin, request_line)
        return target

    def release(self, connection: _Connection) -> None:
        connection.active = False
        if self._closed or not connection.reusable():
            connection.close()
            return
        connection.idle_since = self.loop.time()
        self._idle.setdefault(connection.origin, []).append(connection)
        self._wake_one()

    def forget(self, connection: _Connection) -> None:
        """A connection closed: it no longer counts against the limit."""
        if connection in self._open:
            self._open.discard(connection)
            idle = self._idle.get(connection.origin)
            if idle is not None and connection in idle:
                idle.remove(connection)
            self._wake_one()

    async def close(self) -> None:
        self._closed = True
        for connection in list(self._open):
            connection.close()
        self._idle.clear()
        # let transports deliver connection_lost before the loop goes away
        await asyncio.sleep(0)

    def _pooled(self, origin: Origin) -> _Connection | None:
        """An idle connection to ``origin`` still open and within its keep-alive, if the pool has one."""
        idle = self._idle.get(origin)
        if not idle:
            return None
        now = self.loop.time()
        while idle:
            connection = idle.pop()
            transport = connection.transport
            if transport is None or transport.is_closing():
                continue
            if now - connection.idle_since > self._keepalive_s:
                connection.close()
                continue
            return connection
        return None

    async def _acquire(self, origin: Origin) -> tuple[_Connection, bool]:
        while True:
            if self._closed:
                raise ReplicaDisconnected("the gateway is shutting down")
            connection = self._pooled(origin)
            if connection is not None:
                return connection, True
            if len(self._open) < self._limit:
                return await self._connect(origin), False
            if self._close_one_idle():
                continue
            waiter = self.loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()
                raise

    async def _connect(self, origin: Origin) -> _Connection:
        connection = _Connection(self, origin)
        self._open.add(connection)
        try:
            async with asyncio.timeout(self.connect_s):
                await self.loop.create_connection(
                    lambda: connection,
                    origin.host,
                    origin.port,
                    ssl=self._ssl_context() if origin.scheme == "https" else None,
                )
        except TimeoutError:
            self.forget(connection)
            raise ReplicaTimeout(f"no connection within {self.connect_s:g} s") from None
        except OSError as exc:
            self.forget(connection)
            raise ReplicaConnectError(exc) from exc
        except BaseException:
            self.forget(connection)
            connection.close()
            raise
        return connection

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def _close_one_idle(self) -> bool:
        oldest: _Connection | None = None
        for idle in self._idle.values():
            if idle and (oldest is None or idle[0].idle_since < oldest.idle_since):
                oldest = idle[0]
        if oldest is None:
            return False
        self._idle[oldest.origin].remove(oldest)
        self._open.discard(oldest)
        oldest.close()
        return True

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
