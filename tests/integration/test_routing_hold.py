"""A request waits for the replica that caches its prefix, through the real gateway.

Two simulated replicas that each take one sequence at a time: a long answer to a 600-token prompt
keeps replica A busy. A second request sharing A's prompt prefix arrives either when B is busy too
(it queues, and B frees first) or when B is idle (it would fit there at once). With
``routing.prefix_hold_s`` it waits for A and hits A's prefix cache; without it, it goes to B and
prefills the whole prompt again. Which happened is read from the replicas' own
``vllm:prefix_cache_hits_total``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest

from kvgate.gateway.edge.server import RunningGateway, running_gateway
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config
from tests.integration.test_routing_prefix import prefix_counters

SHARED = "the replica that holds this prefix should serve it again " * 60


async def stream(http: httpx.AsyncClient, prompt: str, max_tokens: int, started: asyncio.Event) -> None:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    async with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for raw in response.aiter_raw():
            if raw:
                started.set()


Pair = tuple[list[str], RunningGateway, httpx.AsyncClient]
"""The replicas' URLs, the gateway, and a client of it."""


@contextlib.asynccontextmanager
async def single_slot_pair(
    prefix_hold_s: float,
) -> AsyncIterator[tuple[list[str], RunningGateway, httpx.AsyncClient]]:
    """Two simulated replicas taking one sequence each, behind a gateway with ``prefix_hold_s``;
    every reservation is back to zero when it closes."""
    async with SimFleet(replicas=2, time_scale=1.0, seed=0, overrides={"warmup_s": 0}) as fleet:
        pool = {"name": "default", "replicas": fleet.urls, "kv_capacity_tokens": 450000, "max_sequences": 1}
        routing = {"warmup_s": 0, "prefix_hold_s": prefix_hold_s}
        async with (
            running_gateway(gateway_config(fleet.urls, pools=[pool], routing=routing)) as gw,
            httpx.AsyncClient(base_url=gw.url, timeout=30) as http,
        ):
            yield fleet.urls, gw, http
            await assert_idle(gw)


async def hits_on_the_queued_request(prefix_hold_s: float) -> float:
    """A and B both busy (A on the shared prefix, B shorter); a request sharing A's prefix queues."""
    async with single_slot_pair(prefix_hold_s) as (urls, gw, http):
        long_started, short_started, queued_started = asyncio.Event(), asyncio.Event(), asyncio.Event()
        long = asyncio.create_task(stream(http, SHARED + "first question", 160, long_started))
        await long_started.wait()
        short = asyncio.create_task(stream(http, "a short unrelated question", 30, short_started))
        await short_started.wait()
        before, _ = await prefix_counters(http, urls)
        queued = asyncio.create_task(stream(http, SHARED + "second question", 4, queued_started))
        assert await eventually(lambda: gw.state.queued == 1)
        await asyncio.gather(long, short, queued)
        after, _ = await prefix_counters(http, urls)
    return after - before


async def hits_on_a_newcomer(prefix_hold_s: float) -> float:
    """A busy on the shared prefix, B idle; a request sharing A's prefix would fit on B at once."""
    async with single_slot_pair(prefix_hold_s) as (urls, _, http):
        long_started, newcomer_started = asyncio.Event(), asyncio.Event()
        long = asyncio.create_task(stream(http, SHARED + "first question", 120, long_started))
        await long_started.wait()
        before, _ = await prefix_counters(http, urls)
        await asyncio.gather(long, stream(http, SHARED + "second question", 4, newcomer_started))
        after, _ = await prefix_counters(http, urls)
    return after - before


@pytest.mark.parametrize("arrives", ["queued", "newcomer"])
@pytest.mark.parametrize(("prefix_hold_s", "hits_prefix"), [(5.0, True), (0.0, False)])
async def test_a_request_waits_for_the_replica_caching_its_prefix(
    arrives: str, prefix_hold_s: float, hits_prefix: bool
) -> None:
    play = hits_on_the_queued_request if arrives == "queued" else hits_on_a_newcomer
    hits = await play(prefix_hold_s)
    assert (hits >= 512) is hits_prefix, hits
