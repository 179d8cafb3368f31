"""The upstream client alone, in this process on uvloop (``--client N``): N non-stream requests to
the zero-delay backends through an aiohttp session set up as the gateway's other upstream calls
are, then through the completion routes' ``ReplicaClient``; CPU microseconds per request each."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import orjson

from bench.harness.processes import children
from bench.proxy.stage import BACKENDS, CHAT_PATH, CHUNKS, MODEL, start_backends


async def time_clients(total: int, concurrency: int) -> tuple[float, float]:
    """CPU microseconds per request of aiohttp and of ``ReplicaClient``."""
    from kvgate.config.server import Server
    from kvgate.gateway.replicas.replica_http import ReplicaClient
    from kvgate.gateway.replicas.upstream import create_session

    body = orjson.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": CHUNKS}
    )
    header_pairs = [(b"content-type", b"application/json"), (b"x-request-id", b"0123456789abcdef")]

    async def timed(one: Callable[[int], Awaitable[bytes]]) -> float:
        remaining = total

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await one(remaining)

        await asyncio.gather(*(worker() for _ in range(concurrency)))  # warm the pools
        remaining = total
        start_s = time.process_time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return (time.process_time() - start_s) / total * 1e6

    with children() as started:
        bases = [f"http://127.0.0.1:{port}" for port in start_backends(started)]
        session = create_session(Server())
        urls = [base + CHAT_PATH for base in bases]
        string_headers = [(name.decode(), value.decode()) for name, value in header_pairs]

        async def via_aiohttp(i: int) -> bytes:
            async with session.post(urls[i % BACKENDS], data=body, headers=string_headers) as response:
                return await response.read()

        aiohttp_us = await timed(via_aiohttp)
        await session.close()
        client = ReplicaClient(connect_s=5.0, first_byte_s=60.0, idle_s=60.0, keepalive_s=30.0, limit=8192)

        async def via_replica_client(i: int) -> bytes:
            response = await client.post(bases[i % BACKENDS], CHAT_PATH, body, header_pairs, stream=False)
            try:
                return await response.read()
            finally:
                response.release()

        replica_client_us = await timed(via_replica_client)
        await client.close()
        return aiohttp_us, replica_client_us
