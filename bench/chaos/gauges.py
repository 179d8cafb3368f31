"""The work a gateway holds, read from its ``/metrics``: each work gauge summed over its series, and
the pools' estimated KV occupancy. A gauge the page lacks reads NaN, never 0: a renamed gauge must
not pass for a drained one."""

from __future__ import annotations

import asyncio
import math
import time

import aiohttp

from bench.harness.metrics import Page, scrape

WORK_GAUGES = (
    "kvgate_queued_requests",
    "kvgate_queued_prompt_tokens",
    "kvgate_pending_prompt_tokens",
    "kvgate_resident_sequences",
    "kvgate_remaining_decode_tokens",
)
KV_ESTIMATE = "kvgate_pool_kv_occupancy_ratio"


def work_of(page: Page) -> dict[str, float]:
    work = {name: page.sum(name, missing=math.nan) for name in WORK_GAUGES}
    work[KV_ESTIMATE] = page.sum(KV_ESTIMATE, {"source": "estimate"}, missing=math.nan)
    return work


async def read_work(session: aiohttp.ClientSession, base_url: str) -> dict[str, float]:
    return work_of(await scrape(session, base_url, (*WORK_GAUGES, KV_ESTIMATE)))


async def wait_drained(
    session: aiohttp.ClientSession, base_url: str, bound_s: float
) -> tuple[float | None, dict[str, float]]:
    """Seconds until every work gauge reads 0 (None: not within ``bound_s``), and the last reading."""
    start = time.monotonic()
    while True:
        work = await read_work(session, base_url)
        if all(v == 0 for v in work.values()):
            return time.monotonic() - start, work
        if time.monotonic() - start > bound_s:
            return None, work
        await asyncio.sleep(0.1)
