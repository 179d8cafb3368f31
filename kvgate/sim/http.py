"""A minimal HTTP/1.1 server on ``asyncio.Protocol`` and httptools, for the simulator's hot path.

One ``Connection`` per socket parses requests and hands each complete one to the handler; the
handler answers now (``respond``) or later (``start_stream`` / ``send`` / ``end_stream``), so a
streaming response needs no task of its own and the engine loop writes tokens straight to the
transport. Requests pipelined behind an unanswered one wait their turn. Streams use chunked
transfer encoding, as uvicorn does for vLLM. A frame that cannot be parsed gets 400 and a close.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import httptools

_REASONS = {
    200: b"OK",
    201: b"Created",
    400: b"Bad Request",
    404: b"Not Found",
    405: b"Method Not Allowed",
    409: b"Conflict",
    500: b"Internal Server Error",
    503: b"Service Unavailable",
}


@dataclass(slots=True)
class Request:
    method: str
    path: str
    headers: dict[bytes, bytes]
    body: bytes = b""
    on_disconnect: Callable[[], None] | None = field(default=None)


Handler = Callable[["Connection", Request], None]


class Connection(asyncio.Protocol):
    __slots__ = (
        "_body",
        "_current",
        "_handler",
        "_headers",
        "_keep_alive",
        "_parser",
        "_pending",
        "_registry",
        "_url",
        "transport",
    )

    def __init__(self, handler: Handler, registry: set[Connection]) -> None:
        self._handler = handler
        self._registry = registry
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._body: list[bytes] = []
        self._pending: deque[Request] = deque()
        self._current: Request | None = None
        self._keep_alive = True
        self.transport: asyncio.Transport | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self._registry.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._registry.discard(self)
        self.transport = None
        current, self._current = self._current, None
        self._pending.clear()
        if current is not None and current.on_disconnect is not None:
            current.on_disconnect()

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is None:
                return
            if self._current is None:
                self._keep_alive = False
                self._write_response(400, b'{"detail":"Invalid HTTP request"}', b"application/json")
            self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}
        self._body = []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        method = self._parser.get_method().decode()
        path = self._url.split(b"?", 1)[0].decode("latin-1")
        request = Request(method, path, self._headers, b"".join(self._body))
        self._pending.append(request)
        if self._current is None:
            self._next()

    # responses
    def _next(self) -> None:
        if self._pending and self.transport is not None:
            self._current = self._pending.popleft()
            self._keep_alive = self._parser.should_keep_alive()
            self._handler(self, self._current)

    def respond(
        self, status: int, body: bytes, content_type: bytes = b"application/json", extra: bytes = b""
    ) -> None:
        """Answer ``status`` with ``body``; an empty ``content_type`` sends none (vLLM's /health)."""
        self._write_response(status, body, content_type, extra)
        self._done()

    def _write_response(self, status: int, body: bytes, content_type: bytes, extra: bytes = b"") -> None:
        if self.transport is None:
            return
        self.transport.write(
            b"HTTP/1.1 %d %s\r\n%scontent-length: %d\r\n%s%s\r\n%s"
            % (
                status,
                _REASONS.get(status, b"Unknown"),
                b"content-type: %s\r\n" % content_type if content_type else b"",
                len(body),
                extra,
                b"" if self._keep_alive else b"connection: close\r\n",
                body,
            )
        )

    def start_stream(self, content_type: bytes = b"text/event-stream; charset=utf-8") -> None:
        if self.transport is not None:
            self.transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ntransfer-encoding: chunked\r\n%s\r\n"
                % (content_type, b"" if self._keep_alive else b"connection: close\r\n")
            )

    def send(self, data: bytes) -> None:
        if self.transport is not None and data:
            self.transport.write(chunk_frame(data))

    def end_stream(self, data: bytes = b"") -> None:
        if self.transport is not None:
            if data:
                self.transport.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
            else:
                self.transport.write(b"0\r\n\r\n")
        self._done()

    def _done(self) -> None:
        self._current = None
        if not self._keep_alive:
            if self.transport is not None:
                self.transport.close()
            return
        if self._pending:
            asyncio.get_running_loop().call_soon(self._next)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


def chunk_frame(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked-encoding body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def unframe(frame: bytes) -> bytes:
    """The payload of one ``chunk_frame``."""
    return frame[frame.index(b"\r\n") + 2 : -2]
