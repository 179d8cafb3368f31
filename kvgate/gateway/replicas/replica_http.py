"""The completion routes' HTTP/1.1 client to replicas: pooled keep-alive connections, httptools.

Why not the shared aiohttp session here: on this project's 2-core machine aiohttp 3.14 on Python
3.11 costs 81-87 µs of CPU per request as a client (a task per request body, header multidicts, a
timer and a response object graph), a third of the gateway's 250 µs budget; this client costs
17-18 µs for the same work (``python -m bench.bench_proxy --client 20000``). It does only what
the two completion routes need: ``POST`` with a body in one write, the response's status and raw
headers, and the body as it arrives. aiohttp still serves every other upstream call (health
probes, ``/metrics`` scrapes, ``/tokenize``).

Timeouts live on each connection (``replica_connection``), not around the caller.

Closing the connection is how a replica learns a request was abandoned (vLLM aborts the sequence
when its client goes away), so a response that is not read to its end is never returned to the pool.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import Callable

from yarl import URL

from kvgate.gateway.replicas.replica_connection import Headers, Origin, ReplicaConnection
from kvgate.gateway.replicas.replica_errors import ReplicaConnectError, ReplicaDisconnected, ReplicaTimeout

_TARGET_CACHE_SIZE = 4096


class ReplicaResponse:
    """A replica's answer: status and raw headers at once, the body as it comes.

    ``next_chunk`` and ``arrival`` are the connection's own methods, bound once: a stream's relay
    loop calls them per chunk (``chunk = next_chunk()``, and while it is None, ``await arrival()``),
    a Python call each and no coroutine, where ``read_chunk`` is the convenient form. ``divert``
    goes further: the body pieces of one read are handed to a callback at once, from the
    connection's own read callback, and only those it declines are kept for reading."""

    __slots__ = ("_client", "_connection", "arrival", "headers", "next_chunk", "status")

    def __init__(self, client: ReplicaClient, connection: ReplicaConnection) -> None:
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
        self._idle: dict[Origin, list[ReplicaConnection]] = {}
        self._open: set[ReplicaConnection] = set()
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

    def release(self, connection: ReplicaConnection) -> None:
        connection.active = False
        if self._closed or not connection.reusable():
            connection.close()
            return
        connection.idle_since = self.loop.time()
        self._idle.setdefault(connection.origin, []).append(connection)
        self._wake_one()

    def forget(self, connection: ReplicaConnection) -> None:
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

    def _pooled(self, origin: Origin) -> ReplicaConnection | None:
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

    async def _acquire(self, origin: Origin) -> tuple[ReplicaConnection, bool]:
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

    async def _connect(self, origin: Origin) -> ReplicaConnection:
        connection = ReplicaConnection(
            origin, first_byte_s=self.first_byte_s, idle_s=self.idle_s, on_lost=self.forget
        )
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
        oldest: ReplicaConnection | None = None
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
