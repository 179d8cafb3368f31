"""KV capacity learnt from each replica's ``vllm:cache_config_info``: a pool that does not type it
admits by what its replicas say, and a typed value is an override that is warned about when the
replicas disagree."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import pytest

from kvgate.gateway.edge.server import RunningGateway, running_gateway
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config

KV_CAPACITY_TOKENS = 4000
"""What every simulated replica really holds (its ``num_gpu_blocks x block_size``)."""
MAX_SEQS = 16
PROMPT = "Summarise the following words: " + " ".join(f"item{i}" for i in range(24))


def small_fleet(time_scale: float = 0.0) -> SimFleet:
    overrides = {"warmup_s": 0, "kv_capacity_tokens": KV_CAPACITY_TOKENS, "max_num_seqs": MAX_SEQS}
    return SimFleet(replicas=2, time_scale=time_scale, seed=0, overrides=overrides)


def config_for(fleet: SimFleet, pool: dict[str, Any] | None = None, **admission: Any) -> Any:
    fields = {"name": "default", "replicas": fleet.urls, "max_sequences": MAX_SEQS, **(pool or {})}
    return gateway_config(fleet.urls, pools=[fields], admission=admission)


def completion(max_tokens: int) -> dict[str, Any]:
    return {"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True}


async def replica_docs(gw: RunningGateway) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=gw.url) as http:
        pools = (await http.get("/admin/pools")).json()["data"]
    assert len(pools) == 1
    replicas: list[dict[str, Any]] = pools[0]["replicas"]
    return replicas


async def test_a_pool_without_a_typed_capacity_admits_by_what_each_replica_reports() -> None:
    async with small_fleet() as fleet, running_gateway(config_for(fleet)) as gw:
        docs = await replica_docs(gw)
        assert [d["kv_capacity_tokens"] for d in docs] == [KV_CAPACITY_TOKENS] * 2
        assert [d["discovered_kv_capacity_tokens"] for d in docs] == [KV_CAPACITY_TOKENS] * 2
        assert [d["configured_kv_capacity_tokens"] for d in docs] == [None, None]
        assert [d["kv_capacity_disagrees"] for d in docs] == [False, False]
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            too_big = await http.post("/v1/completions", json=completion(KV_CAPACITY_TOKENS))
            fits = await http.post("/v1/completions", json=completion(500))
        assert too_big.status_code == 400, too_big.text
        assert f"holds {KV_CAPACITY_TOKENS}" in too_big.json()["error"]["message"]
        assert fits.status_code == 200, fits.text
        assert fits.json()["usage"]["completion_tokens"] == 500
        await assert_idle(gw)


async def test_over_commit_of_a_discovered_capacity_is_refused_and_never_preempts() -> None:
    async with (
        small_fleet(time_scale=0.05) as fleet,
        running_gateway(config_for(fleet, max_queue_wait_s=0)) as gw,
    ):
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as http:
            answers = await asyncio.gather(
                *(http.post("/v1/completions", json=completion(500)) for _ in range(48))
            )
        statuses = [a.status_code for a in answers]
        assert set(statuses) <= {200, 429}, statuses
        assert 200 in statuses, "requests within the discovered capacity are admitted"
        assert 429 in statuses, "48 requests of ~560 KV tokens cannot all fit 2 x 4000 tokens at once"
        assert all(a.json()["error"]["reason"] == "kv_capacity" for a in answers if a.status_code == 429)
        assert sum(r.engine.stats.num_preemptions for r in fleet.replicas) == 0
        await assert_idle(gw)


async def test_a_typed_capacity_that_disagrees_wins_and_is_warned_about_once_per_replica(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="kvgate.scrape")
    typed = 6000
    async with (
        small_fleet() as fleet,
        running_gateway(config_for(fleet, {"kv_capacity_tokens": typed})) as gw,
    ):
        replicas = list(gw.state.replicas.values())
        first_s = [r.scraped.scraped_at_s if r.scraped else 0.0 for r in replicas]
        assert await eventually(
            lambda: all(
                r.scraped is not None and r.scraped.scraped_at_s > s + 0.5
                for r, s in zip(replicas, first_s, strict=True)
            )
        ), "several scrape rounds went by"
        docs = await replica_docs(gw)
        assert [d["kv_capacity_tokens"] for d in docs] == [typed] * 2
        assert [d["configured_kv_capacity_tokens"] for d in docs] == [typed] * 2
        assert [d["discovered_kv_capacity_tokens"] for d in docs] == [KV_CAPACITY_TOKENS] * 2
        assert [d["kv_capacity_disagrees"] for d in docs] == [True, True]
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            too_big = await http.post("/v1/completions", json=completion(typed))
        assert too_big.status_code == 400
        assert f"holds {typed}" in too_big.json()["error"]["message"], "the typed value is the one used"
        warnings = [r.getMessage() for r in caplog.records if r.name == "kvgate.scrape"]
        for replica in replicas:
            assert sum(replica.name in w for w in warnings) == 1, warnings
        assert all(str(typed) in w and str(KV_CAPACITY_TOKENS) in w for w in warnings)
        await assert_idle(gw)
