"""The chaos benchmark's hostile clients, on raw sockets: a well-behaved client library cannot be
made to misbehave. Slowloris (partial headers) and slow bodies drip bytes; slow readers never read."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from dataclasses import dataclass


@dataclass(slots=True)
class RawResult:
    closed_at_s: float | None = None
    """When the server answered or closed the connection, from the attack's start."""
    first_bytes: bytes = b""
    how: str = "open"
    """``open`` (still at the end), ``answered``, ``closed`` (EOF), ``reset`` or ``refused``."""


async def trickle(
    port: int, head: bytes, drip: bytes, every_s: float, hold_s: float, started_s: float
) -> RawResult:
    """Send ``head``, then ``drip`` every ``every_s`` for ``hold_s``: a slowloris (partial headers) or
    a slow body, depending on ``head``. Watches for the server answering or closing."""
    result = RawResult()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        result.how = "refused"
        result.closed_at_s = time.monotonic() - started_s
        return result
    try:
        writer.write(head)
        end = started_s + hold_s
        while time.monotonic() < end:
            try:
                data = await asyncio.wait_for(reader.read(256), timeout=every_s)
            except TimeoutError:
                writer.write(drip)
                continue
            result.closed_at_s = time.monotonic() - started_s
            result.first_bytes = data[:64]
            result.how = "answered" if data else "closed"
            return result
    except OSError:
        result.closed_at_s = time.monotonic() - started_s
        result.how = "reset"
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return result


def slow_reader_socket(port: int, body: bytes) -> socket.socket:
    """A connection that sends a streaming request and then never reads: a tiny receive buffer, so
    the gateway's writes back up at once instead of filling megabytes of loopback buffer."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    head = (
        b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    )
    sock.sendall(head + body)
    sock.setblocking(False)
    return sock
