"""Prefix locality across gateways: two real gateways sharing claims through Redis, each subscribed
to every replica's KV cache events, send a prompt prefix to the replica that caches it whichever of
them receives it. The gateway that did not route the first request learns where the prefix went
from the replica's own events, not from the other gateway."""

from __future__ import annotations

import contextlib
import uuid

import httpx
import orjson
import pytest

from kvgate.gateway.edge.server import RunningGateway, running_gateway
from kvgate.routing.prefix_hash import block_hashes
from kvgate.sim.fleet import SimFleet
from kvgate.sim.kv_publisher import KvEventsConfig
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config

PREFIXES = 6


def prompt(prefix: int, user: int) -> str:
    system = " ".join(f"rule{prefix}-{i}" for i in range(200))
    return f"{system}\nUser {user}: say hello."


def holders(gw: RunningGateway, hashes: list[int]) -> set[str]:
    """The replicas this gateway's index says cache the prefix, from their events alone."""
    cache = gw.gateway.path.dispatcher.router.cache
    return {r for r in gw.state.replicas if cache.match(r, hashes, float("inf")).gpu_blocks > 0}


async def test_a_prefix_goes_to_the_replica_caching_it_through_either_gateway(
    redis_url: str, capfd: pytest.CaptureFixture[str]
) -> None:
    namespace = f"kvgate-test-{uuid.uuid4().hex[:8]}"
    async with SimFleet(
        replicas=3, time_scale=0.0, seed=0, overrides={"warmup_s": 0}, kv_events=KvEventsConfig()
    ) as fleet:
        coordination = {"redis_url": redis_url, "namespace": namespace, "interval_s": 0.05}
        config = gateway_config(fleet.urls, routing={"warmup_s": 0}, coordination=coordination)
        tokenizer = fleet.replicas[0]._prompts.tokenizer
        async with contextlib.AsyncExitStack() as stack:
            gateways = [await stack.enter_async_context(running_gateway(config)) for _ in range(2)]
            for gw in gateways:  # a replica is a candidate once probed healthy and scraped ...
                assert await eventually(
                    lambda s=gw.state: all(r.healthy and r.scraped is not None for r in s.replicas.values())
                ), gw.state.replicas
                # ... once the gateway holds a claim on it, and here once its events are followed
                coordinator = gw.gateway.coordinator
                assert coordinator is not None
                assert await eventually(
                    lambda c=coordinator: (
                        len(c.book.claimed()) == 3
                        and all(share.kv_tokens > 100000 for share in c.book.claimed().values())
                    )
                )
                cache = gw.gateway.path.dispatcher.router.cache
                assert await eventually(lambda c=cache, s=gw.state: all(c.follows(r) for r in s.replicas))
            async with httpx.AsyncClient(timeout=30) as http:
                for prefix in range(PREFIXES):
                    hashes = block_hashes(tokenizer.encode(prompt(prefix, 0)), 16)[:40]
                    for user in range(4):
                        gw = gateways[(prefix + user) % 2]
                        body = {"model": MODEL, "prompt": prompt(prefix, user), "max_tokens": 2}
                        headers = {"x-request-id": f"p{prefix}-u{user}"}
                        answer = await http.post(gw.url + "/v1/completions", json=body, headers=headers)
                        assert answer.status_code == 200, answer.text
                        if user == 0:  # both indexes follow the first request's replica before the next
                            for other in gateways:
                                assert await eventually(lambda o=other, h=hashes: len(holders(o, h)) == 1)
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
