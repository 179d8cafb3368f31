"""Per-tenant request limits and model aliases through a real gateway in front of the simulator."""

from __future__ import annotations

import asyncio

import httpx

from kvgate.gateway.edge.server import running_gateway
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, gateway_config

AUTH = {
    "enabled": True,
    "tenants": [{"name": "rated", "api_keys": ["sk-rated"]}, {"name": "narrow", "api_keys": ["sk-narrow"]}],
}
ADMISSION = {
    "tenants": [
        {"name": "rated", "requests_per_min": 2},
        {"name": "narrow", "max_concurrent_requests": 1},
    ]
}


async def test_request_limits_refuse_with_their_reason_and_an_alias_is_served_as_its_model() -> None:
    async with SimFleet(replicas=1, time_scale=0.2, seed=0, overrides={"warmup_s": 0}) as fleet:
        model = {"name": MODEL, "max_model_len": 131072, "kv_bytes_per_token": 131072}
        models = [{**model, "aliases": ["public"]}]
        config = gateway_config(fleet.urls, auth=AUTH, admission=ADMISSION, models=models)
        async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            body = {"model": "public", "prompt": "hi", "max_tokens": 4}
            rated = {"authorization": "Bearer sk-rated"}
            answers = [await http.post("/v1/completions", json=body, headers=rated) for _ in range(3)]
            assert [a.status_code for a in answers] == [200, 200, 429]
            assert answers[0].json()["model"] == MODEL, "the replica served the model the alias names"
            refused = answers[2]
            assert "2 requests per minute" in refused.json()["error"]["message"]
            assert int(refused.headers["retry-after"]) >= 1

            narrow = {"authorization": "Bearer sk-narrow"}
            slow = {"model": MODEL, "prompt": "hi", "max_tokens": 200, "ignore_eos": True}
            first = asyncio.create_task(http.post("/v1/completions", json=slow, headers=narrow))
            tenants = gw.gateway.path.dispatcher.controller.tenants
            while tenants.in_flight.get("narrow") != 1:
                await asyncio.sleep(0.01)
            second = await http.post("/v1/completions", json=body, headers=narrow)
            assert second.status_code == 429
            assert "concurrent requests" in second.json()["error"]["message"]
            assert (await first).status_code == 200
            assert (await http.post("/v1/completions", json=body, headers=narrow)).status_code == 200

            listed = (await http.get("/v1/models", headers=rated)).json()
            assert [m["id"] for m in listed["data"]] == [MODEL, "public"]
            assert (await http.get("/v1/models/public", headers=rated)).json()["root"] == MODEL
            metrics = (await http.get("/metrics")).text
            assert 'reason="tenant_requests"' in metrics and 'reason="tenant_concurrency"' in metrics
            await assert_idle(gw)
            assert tenants.in_flight == {}
