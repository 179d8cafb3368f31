"""Prefill/decode disaggregation through the real gateway and the simulator: a request goes to a
prefill replica for its KV, then with the ``kv_transfer_params`` to a decode replica, and the
client sees one ordinary OpenAI response, shaped as a mixed pool's. A prefill replica that dies
before the hand-off is retried; a decode replica that dies mid-stream ends the stream cleanly; every
work gauge on both pools comes back to zero, and each pool's signals are its own phase's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from kvgate.config.gateway import GatewayConfig
from kvgate.gateway.edge.server import RunningGateway, running_gateway
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config

CAPACITY = {"kv_capacity_tokens": 450000}
FAST = {"interval_s": 0.1, "timeout_s": 0.5}
WORK_GAUGES = (
    "kvgate_pending_prompt_tokens",
    "kvgate_resident_sequences",
    "kvgate_remaining_decode_tokens",
    "kvgate_pool_kv_occupancy_ratio",
)


def pd_config(fleet: SimFleet, prefill: int, **sections: Any) -> GatewayConfig:
    """The fleet's first ``prefill`` replicas as the prefill pool, the rest as the decode pool."""
    urls = fleet.urls
    pools = [
        {"name": "prefill", "role": "prefill", "replicas": urls[:prefill], **CAPACITY},
        {"name": "decode", "role": "decode", "replicas": urls[prefill:], **CAPACITY},
    ]
    return gateway_config([], pools=pools, **{"health": FAST, **sections})


@asynccontextmanager
async def pd_fleet(prefill: int, decode: int, time_scale: float = 0.0) -> AsyncIterator[SimFleet]:
    async with SimFleet(replicas=0, time_scale=time_scale, seed=0, overrides={"warmup_s": 0}) as fleet:
        for _ in range(prefill):
            await fleet.add_replica(role="prefill")
        for _ in range(decode):
            await fleet.add_replica(role="decode")
        yield fleet


def shape(value: Any) -> Any:
    """The keys and value types of a JSON document, without the values."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items() if k not in ("kv_transfer_params",)}
    if isinstance(value, list):
        return [shape(v) for v in value[:1]]
    return type(value).__name__


def events(body: bytes) -> list[Any]:
    out = []
    for event in body.split(b"\n\n"):
        if event.startswith(b"data: ") and event != b"data: [DONE]":
            out.append(orjson.loads(event[6:]))
    return out


async def ask(http: httpx.AsyncClient, path: str, stream: bool, max_tokens: int = 12) -> tuple[int, bytes]:
    payload: dict[str, Any] = (
        {"messages": [{"role": "user", "content": "Tell me about disaggregated serving"}]}
        if path.endswith("chat/completions")
        else {"prompt": "Disaggregated serving splits prefill from decode because"}
    )
    body = {"model": MODEL, "max_tokens": max_tokens, "ignore_eos": True, "stream": stream, **payload}
    if stream:
        body["stream_options"] = {"include_usage": True}
    response = await http.post(path, json=body)
    return response.status_code, response.content


async def work_gauges(gw: RunningGateway) -> dict[tuple[str, str], float]:
    """kvgate's own work gauges per pool (not the replicas' scraped word, which lags a scrape)."""
    async with httpx.AsyncClient(base_url=gw.url) as http:
        page = (await http.get("/metrics")).text
    return {
        (s.name, s.labels.get("pool", "")): s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
        if s.name in WORK_GAUGES and s.labels.get("source", "estimate") == "estimate"
    }


async def assert_pools_idle(gw: RunningGateway) -> None:
    await assert_idle(gw)
    gauges = await work_gauges(gw)
    assert {pool for _, pool in gauges} >= {"prefill", "decode"}, gauges
    assert all(value == 0 for value in gauges.values()), gauges


async def test_chat_and_completion_streamed_or_not_have_a_mixed_pools_shape() -> None:
    async with (
        pd_fleet(prefill=2, decode=2) as fleet,
        SimFleet(replicas=1, time_scale=0.0, seed=0, overrides={"warmup_s": 0}) as mixed,
        running_gateway(pd_config(fleet, prefill=2)) as gw,
        running_gateway(gateway_config(mixed.urls, health=FAST)) as reference,
    ):
        async with (
            httpx.AsyncClient(base_url=gw.url, timeout=30) as pd,
            httpx.AsyncClient(base_url=reference.url, timeout=30) as whole,
        ):
            for path in ("/v1/chat/completions", "/v1/completions"):
                for stream in (False, True):
                    status, body = await ask(pd, path, stream)
                    want_status, want = await ask(whole, path, stream)
                    assert status == want_status == 200, body
                    if stream:
                        assert body.endswith(b"data: [DONE]\n\n")
                        assert [shape(e) for e in events(body)] == [shape(e) for e in events(want)]
                        assert events(body)[-1]["usage"]["completion_tokens"] == 12
                    else:
                        answer = orjson.loads(body)
                        assert shape(answer) == shape(orjson.loads(want)), path
                        assert answer["usage"]["completion_tokens"] == 12
        async with httpx.AsyncClient(base_url=gw.url) as http:
            pools = (await http.get("/signals")).json()["pools"]
        assert pools["prefill"]["role"] == "prefill" and pools["decode"]["role"] == "decode"
        assert pools["prefill"]["ttft_p95_s"] is not None and pools["prefill"]["itl_p95_s"] is None
        assert pools["prefill"]["prompt_tokens_per_s"] > 0 == pools["prefill"]["output_tokens_per_s"]
        assert pools["decode"]["itl_p95_s"] is not None and pools["decode"]["ttft_p95_s"] is None
        assert pools["decode"]["output_tokens_per_s"] > 0 == pools["decode"]["prompt_tokens_per_s"]
        prefill, decode = fleet.replicas[:2], fleet.replicas[2:]
        assert sum(sum(r.engine.stats.request_success.values()) for r in prefill) == 4
        assert sum(sum(r.engine.stats.request_success.values()) for r in decode) == 4
        assert all(len(r._transfers) == 0 for r in prefill), "every hand-off was pulled by a decode replica"
        await assert_pools_idle(gw)


async def test_a_prefill_replica_killed_before_the_hand_off_is_retried() -> None:
    patient = {"interval_s": 1.0, "timeout_s": 2.0}  # probes of the paused replicas do not eject them first
    async with (
        pd_fleet(prefill=2, decode=1) as fleet,
        running_gateway(pd_config(fleet, 2, health=patient)) as gw,
    ):
        await fleet.pause(0)
        await fleet.pause(1)
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            answer = asyncio.create_task(ask(http, "/v1/completions", stream=True))
            prefill = fleet.replicas[:2]
            assert await eventually(lambda: any(r._stalled for r in prefill))
            stuck = next(i for i, r in enumerate(prefill) if r._stalled)
            await fleet.kill(stuck)
            await fleet.resume(1 - stuck)
            status, body = await answer
        assert status == 200 and body.endswith(b"data: [DONE]\n\n") and b'"error"' not in body
        assert events(body)[-1]["usage"]["completion_tokens"] == 12
        await assert_pools_idle(gw)


async def test_a_decode_replica_killed_mid_stream_ends_the_stream_cleanly() -> None:
    async with (
        pd_fleet(prefill=1, decode=1, time_scale=1.0) as fleet,
        running_gateway(pd_config(fleet, prefill=1)) as gw,
        httpx.AsyncClient(base_url=gw.url, timeout=30) as http,
    ):
        body = {
            "model": MODEL,
            "prompt": "a long story",
            "max_tokens": 3000,
            "ignore_eos": True,
            "stream": True,
        }
        received = bytearray()
        async with http.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            async for raw in response.aiter_raw():
                if not received:
                    await fleet.kill(1)
                received += raw
        assert received.endswith(b"data: [DONE]\n\n") and received.count(b"[DONE]") == 1
        assert b'data: {"error":' in received
        await assert_pools_idle(gw)


async def test_a_full_decode_pool_refuses_before_any_prefill_with_its_own_wait() -> None:
    async with pd_fleet(prefill=1, decode=1) as fleet:
        pools = [p.model_dump() for p in pd_config(fleet, prefill=1).pools]
        pools[1]["kv_capacity_tokens"] = 1000
        config = gateway_config([], pools=pools, health=FAST)
        async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            status, body = await ask(http, "/v1/completions", stream=False, max_tokens=2000)
            assert status == 400 and b"holds 1000" in body
            await fleet.pause(1)
            held = asyncio.create_task(ask(http, "/v1/completions", stream=False, max_tokens=600))
            assert await eventually(lambda: bool(fleet.replicas[1]._stalled))
            response = await http.post(
                "/v1/completions", json={"model": MODEL, "prompt": "and another", "max_tokens": 600}
            )
            assert response.status_code == 429 and "decode replicas" in response.json()["error"]["message"]
            assert int(response.headers["retry-after"]) >= 1
            assert sum(fleet.replicas[0].engine.stats.request_success.values()) == 1
            await fleet.resume(1)
            assert (await held)[0] == 200
            await assert_pools_idle(gw)


async def test_a_migration_splits_a_models_requests_between_the_mixed_pool_and_the_pair_by_share() -> None:
    async with pd_fleet(prefill=1, decode=1) as fleet:
        mixed = await fleet.add_replica()
        pools = [p.model_dump() for p in pd_config(fleet, prefill=1).pools]
        pools[1]["replicas"] = [fleet.urls[1]]
        pools.append({"name": "whole", "role": "mixed", "replicas": [mixed.url], **CAPACITY})
        model = {
            "name": MODEL,
            "max_model_len": 131072,
            "kv_bytes_per_token": 131072,
            "disaggregated_share": 0.25,
        }
        config = gateway_config([], models=[model], pools=pools, health=FAST)
        async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            for stream in (False, True, False, True, False, True, False, True):
                status, _ = await ask(http, "/v1/completions", stream)
                assert status == 200
            await assert_pools_idle(gw)
        served = [sum(r.engine.stats.request_success.values()) for r in fleet.replicas]
        assert served == [2, 2, 6], "a quarter through prefill + decode, the rest whole"
