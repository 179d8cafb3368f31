"""A client's ``X-Request-Id`` is a label, never a key: requests that share one are accounted
separately, one request cannot touch another's reservation by naming its id, and an id that is too
long or not printable ASCII is replaced rather than echoed or forwarded."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from kvgate.gateway.edge.server import running_gateway
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config

KV_CAPACITY_TOKENS = 4000


def slow_fleet(replicas: int = 1) -> SimFleet:
    return SimFleet(
        replicas=replicas,
        time_scale=1.0,
        seed=0,
        record_streams=True,
        overrides={"warmup_s": 0, "kv_capacity_tokens": KV_CAPACITY_TOKENS, "max_num_seqs": 16},
    )


def config_for(fleet: SimFleet, **admission: Any) -> Any:
    pool = {"name": "default", "replicas": fleet.urls, "kv_capacity_tokens": KV_CAPACITY_TOKENS}
    return gateway_config(fleet.urls, pools=[{**pool, "max_sequences": 16}], admission=admission)


def long_stream(max_tokens: int = 400) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "tell a story", "max_tokens": max_tokens, "ignore_eos": True}


async def test_requests_sharing_an_id_are_each_reserved_and_admitted_against_the_cache() -> None:
    async with slow_fleet() as fleet, running_gateway(config_for(fleet, max_queue_wait_s=0)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as http:
            headers = {"x-request-id": "same-id"}
            tasks = [
                asyncio.create_task(http.post("/v1/completions", json=long_stream(), headers=headers))
                for _ in range(20)
            ]
            assert await eventually(lambda: gw.state.ledger.totals().resident_sequences >= 9)
            held = gw.state.ledger.totals()
            assert held.reserved_kv_tokens <= KV_CAPACITY_TOKENS, "admission never over-commits"
            answers = await asyncio.gather(*tasks)
        admitted = [a for a in answers if a.status_code == 200]
        refused = [a for a in answers if a.status_code == 429]
        assert len(admitted) == held.resident_sequences, "every admitted request held its own reservation"
        assert refused, "20 requests of ~400 KV tokens do not fit 4000 tokens, whatever id they share"
        assert all(a.headers["x-request-id"] == "same-id" for a in answers), "the label is still echoed"
        await assert_idle(gw)


async def test_a_request_naming_anothers_id_cannot_release_its_reservation() -> None:
    async with slow_fleet() as fleet, running_gateway(config_for(fleet)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as http:
            victim = asyncio.create_task(
                http.post("/v1/completions", json=long_stream(600), headers={"x-request-id": "victim"})
            )
            assert await eventually(lambda: gw.state.ledger.totals().resident_sequences == 1)
            before = gw.state.ledger.totals().reserved_kv_tokens
            short = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
            intruder = await http.post(
                "/v1/completions",
                json=short,
                headers={"x-request-id": "victim", "authorization": "Bearer sk-other-tenant"},
            )
            assert intruder.status_code == 200
            assert not victim.done(), "the victim is still streaming"
            after = gw.state.ledger.totals()
            assert after.resident_sequences == 1
            assert after.reserved_kv_tokens == before, "the victim's reservation is intact"
            assert (await victim).status_code == 200
        await assert_idle(gw)


async def test_a_valid_client_id_is_echoed_and_forwarded_and_a_hostile_one_is_replaced() -> None:
    async with (
        SimFleet(replicas=1, time_scale=0.0, seed=0, record_streams=True) as fleet,
        running_gateway(gateway_config(fleet.urls)) as gw,
        httpx.AsyncClient(base_url=gw.url, timeout=30) as http,
    ):
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
        good = await http.post("/v1/completions", json=body, headers={"x-request-id": "trace-42.a_b:c"})
        assert good.headers["x-request-id"] == "trace-42.a_b:c"
        assert good.json()["id"] == "cmpl-trace-42.a_b:c", "the replica received the client's label"
        for hostile in ("x" * 129, "two words", "tab\there", "caf\u00e9"):
            answer = await http.post(
                "/v1/completions", json=body, headers=[("x-request-id", hostile.encode("utf-8"))]
            )
            assert answer.status_code == 200
            echoed = answer.headers["x-request-id"]
            assert echoed != hostile and 0 < len(echoed) <= 128 and echoed.isascii() and echoed.isprintable()
            assert answer.json()["id"] == f"cmpl-{echoed}", "the replica got the replacement, not the input"
        unknown_model = await http.post(
            "/v1/completions", json={**body, "model": "nope"}, headers={"x-request-id": "y" * 500}
        )
        assert unknown_model.status_code == 404
        assert len(unknown_model.headers["x-request-id"]) <= 128
        await assert_idle(gw)
