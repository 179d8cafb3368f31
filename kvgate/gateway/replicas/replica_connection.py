"""One keep-alive HTTP/1.1 connection to a replica, parsed by httptools, one response at a time.

Timeouts live here, not around the caller: one timer per connection, kept across its requests and
moved only when it fires early (to the deadline then in force) or a deadline comes before it, so
neither a request nor a streamed chunk costs a timer of its own (a timer set and cancelled costs
~2 µs of CPU on uvloop), only a clock read. Until the response's first body byte the deadline is
``first_byte_s`` after the request was written (a whole non-streamed generation); after it, a
streamed response may be silent for at most ``idle_s`` between chunks. A connection whose reader is
paused (the client is slower than the replica) is never timed out for idleness: the silence is the
gateway's.
"""

from __future__ import annotations

import asyncio
import collections
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import httptools
from yarl import URL

from kvgate.gateway.replicas.replica_errors import (
    ReplicaDisconnected,
    ReplicaProtocolError,
    ReplicaTimeout,
)

_HIGH_WATER_BYTES = 256 * 1024
"""Buffered body bytes above which the connection stops reading until the relay catches up."""

Headers = list[tuple[bytes, bytes]]


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


class ReplicaConnection(asyncio.Protocol):
    """One keep-alive connection; it parses one response at a time."""

    def __init__(
        self,
        origin: Origin,
        *,
        first_byte_s: float,
        idle_s: float,
        on_lost: Callable[[ReplicaConnection], None],
    ) -> None:
        self.origin = origin
        self._first_byte_s = first_byte_s
        self._idle_s = idle_s
        self._on_lost = on_lost
        """The pool's ``forget``: a connection that closes or fails leaves it at once."""
        self._loop = asyncio.get_running_loop()
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
        self._first_byte_at = now + self._first_byte_s
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
        self._on_lost(self)
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
        self._on_lost(self)
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
                self._arm(now + self._idle_s)
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
                self._arm(now + self._idle_s)
                return
            deadline = self._last_body_at + self._idle_s
            what = f"no chunk for {self._idle_s:g} s"
        else:
            deadline = self._first_byte_at
            what = f"no answer within {self._first_byte_s:g} s"
        if now < deadline:
            self._arm(deadline)
            return
        self._fail(ReplicaTimeout(what))
        self.close()
