"""The proxy benchmark's client side: requests at a fixed concurrency, or at a fixed rate.

One aiohttp session drives both sides of a scenario (straight to the backends, and through the
gateway), so the difference between them is the gateway's. Every answer must be a 200, read whole.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp


@dataclass(frozen=True, slots=True)
class Result:
    latencies_s: list[float]
    wall_s: float

    def p(self, q: float) -> float:
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def drive(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    total: int,
    concurrency: int,
) -> Result:
    latencies: list[float] = []
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            start = time.perf_counter()
            async with session.post(url, data=body, headers=headers) as response:
                async for _ in response.content.iter_any():
                    pass
                assert response.status == 200, response.status
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Result(latencies, time.perf_counter() - start)


async def drive_spread(
    session: aiohttp.ClientSession,
    urls: list[str],
    body: bytes,
    headers: dict[str, str],
    total: int,
    concurrency: int,
) -> Result:
    """``drive`` split evenly over ``urls`` (the backends, each taking its share at once)."""
    per = concurrency // len(urls)
    results = await asyncio.gather(
        *(drive(session, url, body, headers, total // len(urls), per) for url in urls)
    )
    return Result([x for r in results for x in r.latencies_s], max(r.wall_s for r in results))


async def drive_at_rate(
    session: aiohttp.ClientSession,
    urls: list[str],
    body: bytes,
    headers: dict[str, str],
    total: int,
    rate: float,
) -> Result:
    """Open loop: one request every ``1 / rate`` seconds whatever the answers do, so latency is
    measured at a load the machine carries rather than at saturation."""
    latencies: list[float] = []

    async def one(url: str) -> None:
        start = time.perf_counter()
        async with session.post(url, data=body, headers=headers) as response:
            await response.read()
            assert response.status == 200, response.status
        latencies.append(time.perf_counter() - start)

    loop = asyncio.get_running_loop()
    tasks = []
    start = loop.time()
    for i in range(total):
        delay = start + i / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(urls[i % len(urls)])))
    await asyncio.gather(*tasks)
    return Result(latencies, loop.time() - start)
