"""``/admin/pools``: a real gateway in front of a simulated fleet, resized through the admin route."""

from __future__ import annotations

from typing import Any

import aiohttp
import httpx

from kvgate.gateway.edge.server import RunningGateway, running_gateway
from kvgate.gateway.replicas.scrape import Scraper
from kvgate.sim.fleet import SimFleet
from kvgate.sim.replica import SimReplica
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config


def served_by(fleet: SimFleet, request_id: str) -> list[int]:
    return [r.index for r in fleet.replicas if r.recorded(request_id)]


async def complete(http: httpx.AsyncClient, request_id: str) -> httpx.Response:
    body = {"model": MODEL, "prompt": "Say hi", "max_tokens": 2}
    return await http.post("/v1/completions", json=body, headers={"x-request-id": request_id})


async def put_urls(http: httpx.AsyncClient, urls: list[str], pool: str = "default") -> httpx.Response:
    return await http.put(f"/admin/pools/{pool}/replicas", json={"urls": urls})


def replica_docs(pool_doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["url"]: r for r in pool_doc["replicas"]}


def is_healthy(gw: RunningGateway, replica: SimReplica) -> bool:
    state = gw.state.replicas.get(replica.url)
    return state is not None and state.healthy


async def test_added_replica_is_cold_until_its_health_check_passes_then_serves() -> None:
    async with SimFleet(replicas=1, time_scale=1.0, record_streams=True, seed=0) as fleet:
        config = gateway_config(fleet.urls)
        async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url) as http:
            first = fleet.replicas[0]
            loading = await fleet.add_replica(cold_start_s=1.0)
            response = await put_urls(http, [first.url, loading.url])
            assert response.status_code == 200
            assert replica_docs(response.json())[loading.url]["healthy"] is False

            for i in range(4):
                assert (await complete(http, f"cold-{i}")).status_code == 200
                assert served_by(fleet, f"cold-{i}") == [0]
            assert loading.state == "starting"
            assert not is_healthy(gw, loading)

            await loading.wait_ready()
            assert await eventually(lambda: is_healthy(gw, loading))
            response = await put_urls(http, [loading.url])
            assert list(replica_docs(response.json())) == [loading.url]
            for i in range(3):
                assert (await complete(http, f"warm-{i}")).status_code == 200
                assert served_by(fleet, f"warm-{i}") == [loading.index]
            await assert_idle(gw)


async def test_removed_replica_finishes_its_stream_and_takes_no_new_request() -> None:
    async with (
        SimFleet(replicas=2, time_scale=1.0, record_streams=True, seed=0) as fleet,
        running_gateway(gateway_config(fleet.urls)) as gw,
        httpx.AsyncClient(base_url=gw.url) as http,
    ):
        body = {
            "model": MODEL,
            "prompt": "A long story",
            "max_tokens": 200,
            "stream": True,
            "ignore_eos": True,
        }
        headers = {"x-request-id": "draining"}
        async with http.stream("POST", "/v1/completions", json=body, headers=headers) as stream:
            chunks = stream.aiter_raw()
            received = bytearray(await anext(chunks))
            busy = next(r for r in gw.state.replicas.values() if r.in_flight == 1)
            keep = next(url for url in fleet.urls if url != busy.url)

            response = await put_urls(http, [keep])
            assert response.status_code == 200
            assert list(replica_docs(response.json())) == [keep]
            for i in range(4):
                assert (await complete(http, f"after-{i}")).status_code == 200
                assert [fleet.urls[j] for j in served_by(fleet, f"after-{i}")] == [keep]
            assert busy.in_flight == 1

            async for raw in chunks:
                received += raw
        assert stream.status_code == 200
        assert received.endswith(b"data: [DONE]\n\n")
        assert b'"finish_reason":"length"' in received
        assert busy.in_flight == 0
        await assert_idle(gw)


async def test_pools_listing_shows_health_in_flight_and_scrapes_with_their_age(fleet: SimFleet) -> None:
    async with (
        running_gateway(gateway_config(fleet.urls)) as gw,
        httpx.AsyncClient(base_url=gw.url) as http,
        aiohttp.ClientSession() as session,
    ):
        await Scraper(gw.state, session, interval_s=1.0).scrape_all()
        response = await http.get("/admin/pools")
        assert response.status_code == 200
        (pool,) = response.json()["data"]
        assert pool["name"] == "default" and pool["discovery"] == "static"
        assert pool["models"] == [MODEL]
        docs = replica_docs(pool)
        assert sorted(docs) == sorted(fleet.urls)
        for replica, doc in zip(fleet.replicas, (docs[url] for url in fleet.urls), strict=True):
            assert doc["healthy"] is True and doc["in_flight"] == 0
            scraped = doc["scraped"]
            assert scraped["age_s"] >= 0
            assert scraped["num_requests_running"] == 0
            profile = replica.engine.profile
            assert scraped["capacity_tokens"] == profile.num_gpu_blocks * profile.block_size_tokens
        one = await http.get("/admin/pools/default")
        assert one.status_code == 200 and sorted(replica_docs(one.json())) == sorted(fleet.urls)
        await assert_idle(gw)


async def test_bad_requests_get_openai_shaped_errors(fleet: SimFleet) -> None:
    async with running_gateway(gateway_config(fleet.urls)) as gw, httpx.AsyncClient(base_url=gw.url) as http:
        unknown = await put_urls(http, fleet.urls, pool="nope")
        assert unknown.status_code == 404
        assert unknown.json()["error"]["type"] == "NotFoundError"
        assert (await http.get("/admin/pools/nope")).status_code == 404

        bad = await put_urls(http, ["ftp://a:1", "http://a:1/v1", fleet.urls[0], "http://a:99999"])
        assert bad.status_code == 400
        error = bad.json()["error"]
        assert (error["type"], error["param"], error["code"]) == ("BadRequestError", "urls", 400)
        for url in ("ftp://a:1", "http://a:1/v1", "http://a:99999"):
            assert url in error["message"]
        assert fleet.urls[0] not in error["message"]

        for content in (b"not json", b'{"url": []}', b'{"urls": "http://a:1"}', b"[]", b'{"urls": [1]}'):
            response = await http.put("/admin/pools/default/replicas", content=content)
            assert response.status_code == 400, content
            assert response.json()["error"]["type"] == "BadRequestError"

        assert (await http.post("/admin/pools/default/replicas", json={"urls": []})).status_code == 405
        assert sorted(gw.state.replicas) == sorted(fleet.urls), "no bad request changed the pool"
        await assert_idle(gw)
