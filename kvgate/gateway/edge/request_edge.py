"""What the edge offers one request beyond ASGI, for the proxy's hot path (``RequestEdge``), and a
whole response written through it (``send_whole``).

Its own module, apart from the edge protocol (``kvgate/gateway/edge/http_protocol.py``), because it runs on
every request and every streamed chunk: compiled with the request path (setup.py), where the
protocol, a subclass of uvicorn's, stays interpreted.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle

if TYPE_CHECKING:
    from kvgate.gateway.edge.http_protocol import EdgeProtocol

_CLOSING = b"content-length: %d\r\nconnection: close\r\n\r\n"

REQUEST_EDGE = "kvgate.edge"
"""The scope extension (``scope["extensions"]``) under which a request finds ``{"edge": e}``, its
``RequestEdge``."""


class RequestEdge:
    """What the edge offers one request beyond ASGI, for the proxy's hot path.

    ``write`` writes one chunk of a chunked response body at once, as ``send`` would write it but
    from a plain call: the relay writes a streamed token from the replica's read callback, with no
    task wake-up, coroutine or message per chunk. ``writable()`` says when it may: the response is
    a chunked one under way, writing is not paused (``send`` waits) and the client is still there;
    otherwise ``send`` carries the chunk.

    ``watch(callback)`` has ``callback()`` called once if the client goes (its connection is lost,
    or the edge refuses it) before the response is complete, when ``receive()`` would answer
    ``http.disconnect``: the proxy needs no task of its own per request keeping a ``receive()``
    pending to learn it. As with ``receive()``, only the connection's latest request hears it.

    It holds its request's cycle weakly: the cycle holds the scope that holds this, and a strong
    reference would leave every request's cycle to the garbage collector."""

    __slots__ = ("_cycle", "_flow", "_protocol", "_write", "task")

    def __init__(self, protocol: EdgeProtocol, cycle: RequestResponseCycle) -> None:
        self._protocol = protocol
        self._cycle = weakref.ref(cycle)
        self._flow = cycle.flow
        self._write = cycle.transport.write
        self.task: asyncio.Task[None] | None = None
        """The task serving the request, when the edge started it (a completion route's ``POST``
        from the parser), until the route takes it; None under uvicorn's own dispatch
        (``asyncio.current_task()`` there)."""

    def writable(self) -> bool:
        cycle = self._cycle()
        return (
            cycle is not None
            and cycle.chunked_encoding is True
            and not self._flow.write_paused
            and not cycle.disconnected
            and not cycle.response_complete
        )

    def write(self, body: bytes) -> None:
        """Only when ``writable()``; ``body`` not empty."""
        self._write(b"%x\r\n%b\r\n" % (len(body), body))

    def body(self) -> bytes | None:
        """The request's whole body, taken as ``receive()`` would hand it over, when it has all
        arrived and ``receive()`` would answer at once with it (no ``100 Continue`` is owed, the
        client is still there, no response has begun); None otherwise: ``receive()`` reads it."""
        cycle = self._cycle()
        if (
            cycle is None
            or cycle.more_body
            or cycle.waiting_for_100_continue
            or cycle.disconnected
            or cycle.response_complete
        ):
            return None
        self._flow.resume_reading()
        cycle.message_event.clear()
        body = bytes(cycle.body)
        cycle.body = bytearray()
        return body

    def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        """Write a whole response, ``body`` with its ``content-length`` (``headers`` hold none), in
        one write, with the cycle left as ``send``'s two messages leave it; False (nothing written)
        when ``send`` must carry it: the response is under way, writing is paused, the client has
        gone, or a header would break its line (``send`` refuses those)."""
        cycle = self._cycle()
        if cycle is None or cycle.response_started or cycle.disconnected or self._flow.write_paused:
            return False
        defaults = cycle.default_headers
        content = [STATUS_LINE[status]]
        for name, value in defaults:
            content += (name, b": ", value, b"\r\n")
        for name, value in headers:
            content += (name, b": ", value, b"\r\n")
        keep_alive = cycle.keep_alive
        content.append(b"content-length: %d\r\n\r\n" % len(body) if keep_alive else _CLOSING % len(body))
        head = b"".join(content)
        lines = len(defaults) + len(headers) + (3 if keep_alive else 4)
        if head.count(b"\n") != lines or head.count(b"\r") != lines:
            return False
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        cycle.chunked_encoding = False
        cycle.expected_content_length = 0
        self._write(head + body)
        cycle.response_complete = True
        cycle.message_event.set()
        if not keep_alive:
            cycle.transport.close()
        cycle.on_response()
        return True

    def watch(self, callback: Callable[[], None]) -> None:
        self._protocol._watched = (self._cycle, callback)
        # as ``receive()`` does: a client's leaving is only seen while its connection is read
        # (uvicorn stops reading it while a large request body waits to be taken)
        self._flow.resume_reading()


async def send_whole(
    send: Callable[[dict[str, Any]], Awaitable[None]],
    edge: RequestEdge | None,
    status: int,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
) -> None:
    """A whole response (``headers`` without its length): in one write through ``edge`` when it
    can, otherwise as ``send``'s two messages."""
    if edge is not None and edge.respond(status, headers, body):
        return
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
