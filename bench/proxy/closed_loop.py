"""A minimal keep-alive HTTP/1.1 load generator: a closed loop of N connections, one request each at
a time, on raw asyncio and httptools.

What a router is measured against should cost little itself: on a two-core machine the load
generator, the backends and the router share the cores, and an aiohttp client spends several times
a Rust router's CPU per request, which both throttles the load offered and takes CPU from the router
measured. Each connection writes a prebuilt request and parses the answer with httptools; the
time to the first body bytes (TTFC: for a stream, its first chunk) and to the whole answer are kept
per request. Every answer must be a 200.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools


@dataclass(frozen=True, slots=True)
class LoopResult:
    latencies_s: list[float]
    first_chunk_s: list[float]
    wall_s: float

    def p(self, q: float, values: list[float] | None = None) -> float:
        ordered = sorted(self.latencies_s if values is None else values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")

    def ttfc(self, q: float) -> float:
        return self.p(q, self.first_chunk_s)

    def per_s(self) -> float:
        return len(self.latencies_s) / self.wall_s if self.wall_s else 0.0


class _Connection(asyncio.Protocol):
    """One keep-alive connection; ``exchange`` sends the request and waits for the whole answer."""

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._done: asyncio.Future[None] | None = None
        self._first_s = 0.0
        self._status = 0
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(ConnectionError(f"connection lost: {exc}"))
        if not self.lost.done():
            self.lost.set_result(None)

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if not self._first_s:
            self._first_s = time.perf_counter()

    def on_message_complete(self) -> None:
        if not self._first_s:
            self._first_s = time.perf_counter()
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    async def exchange(self, request: bytes) -> float:
        """The answer's first body bytes' time (``time.perf_counter``), once it is whole."""
        assert self._transport is not None
        self._done = asyncio.get_running_loop().create_future()
        self._first_s = 0.0
        self._transport.write(request)
        await self._done
        if self._status != 200:
            raise AssertionError(f"answered {self._status}")
        return self._first_s

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


def request_bytes(url: str, body: bytes, headers: dict[str, str]) -> bytes:
    parts = urlsplit(url)
    head = [f"POST {parts.path} HTTP/1.1", f"host: {parts.netloc}", f"content-length: {len(body)}"]
    head += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def closed_loop(
    url: str, body: bytes, headers: dict[str, str], total: int, concurrency: int
) -> LoopResult:
    """``total`` requests over ``concurrency`` keep-alive connections, each sending its next request
    as soon as its last answer is whole."""
    parts = urlsplit(url)
    loop = asyncio.get_running_loop()
    request = request_bytes(url, body, headers)
    connections = []
    for _ in range(concurrency):
        _, connection = await loop.create_connection(_Connection, parts.hostname or "", parts.port or 80)
        connections.append(connection)
    latencies: list[float] = []
    first_chunks: list[float] = []
    remaining = total

    async def worker(connection: _Connection) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            start = time.perf_counter()
            first = await connection.exchange(request)
            end = time.perf_counter()
            latencies.append(end - start)
            first_chunks.append(first - start)

    start = time.perf_counter()
    try:
        await asyncio.gather(*(worker(c) for c in connections))
    finally:
        for connection in connections:
            connection.close()
        await asyncio.gather(*(c.lost for c in connections))
    return LoopResult(latencies, first_chunks, time.perf_counter() - start)
