"""Several real gateways in front of one simulated replica, sharing it through claims in a real
Redis: together they admit what one gateway alone would, never more, and give everything back.

The replica's KV cache holds 12 of the test's long streams. One gateway admits 12 of 60 sent at
once; two or four gateways, each sent its part of the 60, admit at most 12 between them (their
claims on the replica never sum past its capacity) and the replica never preempts. When the streams
end every gateway's ledger, queue and work gauges are back to zero and every claim in Redis says
nothing is used; when the gateways stop no key is left."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from kvgate.admission.tokenizer import TiktokenTokenizer
from kvgate.gateway.coordination.claim_script import claims_key
from kvgate.gateway.edge.server import RunningGateway, running_gateway
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config
from tests.integration.processes import assert_process_idle

PROMPT = "Tell a long story about a gateway and its replicas."
PROMPT_TOKENS = TiktokenTokenizer.from_name().count(PROMPT)
MAX_TOKENS = 1000
STREAMS = 60
FITS = 12
KV_CAPACITY_TOKENS = 12 * 1024 + 512
"""The simulator's KV cache: 12 streams of ``PROMPT_TOKENS + MAX_TOKENS`` in 16-token blocks, not 13."""
FAST_SYNC = {"interval_s": 0.05, "lease_s": 2.0}


def config_for(fleet: SimFleet, redis_url: str | None, namespace: str) -> Any:
    sections: dict[str, Any] = {
        "pools": [{"name": "default", "replicas": fleet.urls}],
        "routing": {"warmup_s": 0},
        "admission": {"max_queue_wait_s": 1.0},
    }
    if redis_url is not None:
        sections["coordination"] = {"redis_url": redis_url, "namespace": namespace, **FAST_SYNC}
    return gateway_config(fleet.urls, **sections)


def stream() -> dict[str, Any]:
    return {"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True}


async def consume(http: httpx.AsyncClient, gw: RunningGateway) -> int:
    async with http.stream("POST", gw.url + "/v1/completions", json=stream()) as response:
        async for _ in response.aiter_bytes():
            pass
        return response.status_code


async def admitted_at_most(gateways: list[RunningGateway], fleet: SimFleet) -> tuple[int, int, int]:
    """Send the 60 streams round the gateways; the most admitted at once (by the gateways' ledgers,
    and running on the replica), and how many finished with 200."""
    engine = fleet.replicas[0].engine
    peak_admitted = peak_running = 0
    done = asyncio.Event()

    async def watch() -> None:
        nonlocal peak_admitted, peak_running
        while not done.is_set():
            admitted = sum(gw.state.ledger.totals().resident_sequences for gw in gateways)
            peak_admitted = max(peak_admitted, admitted)
            peak_running = max(peak_running, engine.num_running)
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    limits = httpx.Limits(max_connections=STREAMS)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        statuses = await asyncio.gather(*(consume(http, gateways[i % len(gateways)]) for i in range(STREAMS)))
    done.set()
    await watcher
    return peak_admitted, peak_running, statuses.count(200)


async def used_in_redis(client: aioredis.Redis, key: str) -> list[tuple[int, int]]:
    """(used KV tokens, used sequences) of every gateway's claim on the replica."""
    fields = await client.hgetall(key)
    return [tuple(int(x) for x in value.split()[4:6]) for value in fields.values()]  # type: ignore[misc]


@pytest.fixture
async def fleet() -> Any:
    overrides = {"warmup_s": 0, "kv_capacity_tokens": KV_CAPACITY_TOKENS}
    async with SimFleet(replicas=1, time_scale=0.05, seed=0, overrides=overrides) as sim:
        yield sim


async def test_one_gateway_alone_admits_twelve_of_sixty(fleet: SimFleet) -> None:
    async with running_gateway(config_for(fleet, None, "")) as gw:
        peak, running, finished = await admitted_at_most([gw], fleet)
        await assert_idle(gw)
    assert peak == FITS and running <= FITS, (peak, running)
    assert finished >= FITS
    assert fleet.replicas[0].engine.stats.num_preemptions == 0


@pytest.mark.parametrize("gateways", [2, 4])
async def test_gateways_sharing_redis_admit_together_what_one_admits_alone(
    gateways: int, fleet: SimFleet, redis_url: str
) -> None:
    namespace = f"kvgate-test-{uuid.uuid4().hex[:8]}"
    config = config_for(fleet, redis_url, namespace)
    client = aioredis.from_url(redis_url)
    key = ""
    try:
        async with contextlib.AsyncExitStack() as stack:
            running = [await stack.enter_async_context(running_gateway(config)) for _ in range(gateways)]
            key = claims_key(namespace, next(iter(running[0].state.replicas)))
            for gw in running:
                assert gw.gateway.coordinator is not None and gw.gateway.coordinator.connected
            assert await eventually(lambda: all(gw.gateway.coordinator.book.held for gw in running))  # type: ignore[union-attr]
            peak, running_at_once, finished = await admitted_at_most(running, fleet)
            assert peak <= FITS, f"{gateways} gateways admitted {peak} at once, the replica holds {FITS}"
            assert running_at_once <= FITS
            assert finished >= FITS // 2, finished
            assert fleet.replicas[0].engine.stats.num_preemptions == 0
            for gw in running:
                await assert_idle(gw)
                await assert_process_idle(gw.url)
            assert await _eventually_async(lambda: used_in_redis(client, key), [(0, 0)] * gateways)
            claims = [int(v.split()[0]) for v in (await client.hgetall(key)).values()]
            assert sum(claims) <= KV_CAPACITY_TOKENS
        assert await client.exists(key) == 0
    finally:
        if key:
            await client.delete(key)
        await client.aclose()


async def _eventually_async(read: Any, expected: Any, timeout_s: float = 10.0) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while loop.time() < end:
        if sorted(await read()) == sorted(expected):
            return True
        await asyncio.sleep(0.02)
    return False
