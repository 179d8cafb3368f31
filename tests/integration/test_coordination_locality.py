"""Prefix locality across gateways: two real gateways sharing claims through Redis send a prompt
prefix to the same replica whichever of them receives it (a prefix's home is rendezvous hashing over
the replica ids, the same in every process), so the replica's prefix cache serves both. While the
claims settle (a gateway that just started holds none yet) a prefix spills like one whose home is
full; once each gateway holds its share of every replica, homes agree."""

from __future__ import annotations

import contextlib
import uuid

import httpx
import orjson
import pytest

from kvgate.gateway.edge.server import running_gateway
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config

PREFIXES = 6


def prompt(prefix: int, user: int) -> str:
    system = " ".join(f"rule{prefix}-{i}" for i in range(200))
    return f"{system}\nUser {user}: say hello."


async def test_a_prefix_goes_to_the_same_replica_through_either_gateway(
    redis_url: str, capfd: pytest.CaptureFixture[str]
) -> None:
    namespace = f"kvgate-test-{uuid.uuid4().hex[:8]}"
    async with SimFleet(replicas=3, time_scale=0.0, seed=0, overrides={"warmup_s": 0}) as fleet:
        coordination = {"redis_url": redis_url, "namespace": namespace, "interval_s": 0.05}
        config = gateway_config(fleet.urls, routing={"warmup_s": 0}, coordination=coordination)
        async with contextlib.AsyncExitStack() as stack:
            gateways = [await stack.enter_async_context(running_gateway(config)) for _ in range(2)]
            for gw in gateways:  # a replica is a candidate once probed healthy and scraped ...
                assert await eventually(
                    lambda s=gw.state: all(r.healthy and r.scraped is not None for r in s.replicas.values())
                ), gw.state.replicas
                # ... and once the gateway holds a claim on it
                coordinator = gw.gateway.coordinator
                assert coordinator is not None
                assert await eventually(
                    lambda c=coordinator: (
                        len(c.book.claimed()) == 3
                        and all(share.kv_tokens > 100000 for share in c.book.claimed().values())
                    )
                )
            async with httpx.AsyncClient(timeout=30) as http:
                for prefix in range(PREFIXES):
                    for user in range(4):
                        gw = gateways[user % 2]
                        body = {"model": MODEL, "prompt": prompt(prefix, user), "max_tokens": 2}
                        headers = {"x-request-id": f"p{prefix}-u{user}"}
                        answer = await http.post(gw.url + "/v1/completions", json=body, headers=headers)
                        assert answer.status_code == 200, answer.text
            for gw in gateways:
                await assert_idle(gw)
    homes: dict[str, set[str]] = {}
    for line in capfd.readouterr().err.splitlines():
        if not line.startswith("{"):
            continue
        record = orjson.loads(line)
        if record.get("event") == "access":
            homes.setdefault(record["x_request_id"].split("-")[0], set()).add(record["replica"])
    assert len(homes) == PREFIXES, homes
    assert all(len(replicas) == 1 for replicas in homes.values()), homes
    assert len(set().union(*homes.values())) > 1, "prefixes spread over the replicas"
