"""The scraper against the simulator's vLLM ``/metrics``: what it reads, and what a failure keeps."""

from __future__ import annotations

import asyncio
import contextlib
import time

import aiohttp

from kvgate.gateway.replicas.scrape import Scraper, parse_vllm_metrics, scraped_capacity_tokens
from kvgate.gateway.state import GatewayState
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, eventually, gateway_config

KV_CAPACITY_TOKENS = 20_000


async def test_simulator_page_parses_to_its_engine_state() -> None:
    async with (
        SimFleet(replicas=1, time_scale=0.0, overrides={"kv_capacity_tokens": KV_CAPACITY_TOKENS}) as fleet,
        aiohttp.ClientSession() as session,
    ):
        async with session.get(fleet.urls[0] + "/metrics") as response:
            text = await response.text()
        scraped = parse_vllm_metrics(text, now_s=3.0)
        engine = fleet.replicas[0].engine
        assert scraped is not None
        assert scraped.scraped_at_s == 3.0
        assert (scraped.num_requests_running, scraped.num_requests_waiting) == (0, 0)
        assert scraped.kv_cache_usage_ratio == engine.kv_cache_usage_ratio
        assert scraped.block_size_tokens == engine.profile.block_size_tokens
        assert scraped_capacity_tokens(scraped) == KV_CAPACITY_TOKENS


async def test_scrape_sees_a_running_request_and_a_dead_replica_keeps_its_last_value() -> None:
    async with (
        SimFleet(replicas=2, time_scale=1.0, overrides={"kv_capacity_tokens": KV_CAPACITY_TOKENS}) as fleet,
        aiohttp.ClientSession() as session,
    ):
        state = GatewayState.from_config(gateway_config(fleet.urls))
        busy, other = (state.replicas[url.rstrip("/")] for url in fleet.urls)
        scraper = Scraper(state, session, interval_s=0.05)
        body = {"model": MODEL, "prompt": "tell me a long story", "max_tokens": 2000, "stream": True}
        async with session.post(fleet.urls[0] + "/v1/completions", json=body) as stream:
            await stream.content.readline()
            before_s = time.monotonic()
            await scraper.scrape_all()
            after_s = time.monotonic()
        assert busy.scraped is not None and other.scraped is not None
        assert busy.scraped.num_requests_running == 1
        assert busy.scraped.kv_cache_usage_ratio > 0
        assert other.scraped.num_requests_running == 0
        assert other.scraped.kv_cache_usage_ratio == 0
        assert before_s <= busy.scraped.scraped_at_s <= after_s

        last = other.scraped
        await fleet.kill(1)
        task = asyncio.create_task(scraper.run())
        try:
            assert await eventually(lambda: busy.scraped is not None and busy.scraped.scraped_at_s > after_s)
            assert await eventually(
                lambda: busy.scraped is not None and busy.scraped.num_requests_running == 0
            )
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        assert other.scraped is last


async def test_a_scrape_gives_each_replica_of_an_untyped_pool_its_capacity() -> None:
    async with (
        SimFleet(replicas=2, time_scale=0.0, overrides={"kv_capacity_tokens": KV_CAPACITY_TOKENS}) as fleet,
        aiohttp.ClientSession() as session,
    ):
        untyped = [{"name": "default", "replicas": fleet.urls}]
        state = GatewayState.from_config(gateway_config(fleet.urls, pools=untyped))
        assert [r.kv_capacity_tokens for r in state.replicas.values()] == [0, 0], "unknown until told"
        await Scraper(state, session, interval_s=0.05).scrape_all()
        assert [r.kv_capacity_tokens for r in state.replicas.values()] == [KV_CAPACITY_TOKENS] * 2
        assert [r.discovered_kv_capacity_tokens for r in state.replicas.values()] == [KV_CAPACITY_TOKENS] * 2
