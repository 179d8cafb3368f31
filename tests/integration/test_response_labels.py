"""The responses counter says which model and route each answer was for, and, when configured, which
tenant (one of the configured ones: a client cannot grow the label set)."""

from __future__ import annotations

import re

import httpx

from kvgate.gateway.edge.server import running_gateway
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, gateway_config

AUTH = {"enabled": True, "tenants": [{"name": "team", "api_keys": ["sk-team"]}]}


def responses(exposition: str) -> dict[tuple[str, ...], float]:
    found = {}
    for labels, value in re.findall(r"^kvgate_responses_total\{([^}]*)\} (\S+)$", exposition, re.M):
        pairs = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        key = (pairs["code"], pairs["reason"], pairs["model"], pairs["route"], pairs["tenant"])
        found[key] = float(value)
    return found


async def test_answers_are_counted_by_model_and_route_and_optionally_tenant(fleet: SimFleet) -> None:
    for tenant_label in (False, True):
        config = gateway_config(fleet.urls, auth=AUTH, metrics={"tenant_label": tenant_label})
        async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            team = {"authorization": "Bearer sk-team"}
            chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            assert (await http.post("/v1/chat/completions", json=chat, headers=team)).status_code == 200
            embed = {"model": MODEL, "input": "hi"}
            assert (await http.post("/v1/embeddings", json=embed, headers=team)).status_code == 200
            unknown = {**chat, "model": "made-up-by-a-client"}
            assert (await http.post("/v1/chat/completions", json=unknown, headers=team)).status_code == 404
            await assert_idle(gw)
            counted = responses((await http.get("/metrics", headers=team)).text)
            who = "team" if tenant_label else ""
            assert counted == {
                ("200", "replica", MODEL, "/v1/chat/completions", who): 1.0,
                ("200", "replica", MODEL, "/v1/embeddings", who): 1.0,
                ("404", "model_not_found", "", "/v1/chat/completions", ""): 1.0,
            }
