"""The warm-up ramp through the real gateway: a replica added to a warm pool with
``PUT /admin/pools/{pool}/replicas`` takes a small share of a steady stream at first, and a share
that rises towards its fair one as ``routing.warmup_s`` passes."""

from __future__ import annotations

import asyncio
import time

import httpx

from kvgate.gateway.edge.server import RunningGateway, running_gateway
from kvgate.routing.health import HealthState
from kvgate.sim.fleet import SimFleet
from kvgate.sim.replica import SimReplica
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config

WARMUP_S = 3.0
RAMP = {"warmup_s": WARMUP_S, "min_ratio": 0.1, "aggression": 0.5}
WINDOW_ENDS = (WARMUP_S / 4, WARMUP_S / 2, 3 * WARMUP_S / 4, WARMUP_S, 4 * WARMUP_S / 3)
"""Ends of the windows, in seconds since the added replica became ready: the first quarter of the
warm-up (early), the second and third (middle), the last quarter and a third after it (late)."""
WORKERS = 4


def served(replica: SimReplica) -> int:
    return sum(replica.engine.stats.request_success.values())


def share(counts: list[tuple[int, int]]) -> float:
    """The added replica's share of the requests of several windows together."""
    return sum(to_added for to_added, _ in counts) / sum(total for _, total in counts)


async def stream_until(http: httpx.AsyncClient, end_s: float, first_index: int) -> int:
    """Short completions, ``WORKERS`` at a time, until ``time.monotonic()`` reaches ``end_s``;
    returns how many were sent. Every prompt opens with its own words, so none shares a prefix."""
    sent = 0

    async def worker(offset: int) -> None:
        nonlocal sent
        index = first_index + offset
        while time.monotonic() < end_s:
            body = {"model": MODEL, "prompt": f"request {index} asks a short question", "max_tokens": 2}
            answer = await http.post("/v1/completions", json=body)
            assert answer.status_code == 200, answer.text
            sent += 1
            index += WORKERS

    await asyncio.gather(*(worker(i) for i in range(WORKERS)))
    return sent


async def ready_since_s(gw: RunningGateway, url: str) -> float:
    health = gw.gateway.path.fleet.health
    assert await eventually(lambda: health.get(url).state is HealthState.HEALTHY)
    ready_s = health.get(url).ready_since_s
    assert ready_s is not None
    return ready_s


async def test_an_added_replica_takes_a_share_that_ramps_up_to_its_fair_share() -> None:
    async with SimFleet(replicas=2, time_scale=0.0, seed=0, overrides={"warmup_s": 0}) as fleet:
        config = gateway_config(fleet.urls, health={"interval_s": 0.1, "timeout_s": 0.5}, routing=RAMP)
        async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            warm_since_s = max([await ready_since_s(gw, url) for url in fleet.urls])
            await stream_until(http, warm_since_s + WARMUP_S, 0)
            added = await fleet.add_replica(cold_start_s=0.0)
            await added.wait_ready()
            answer = await http.put("/admin/pools/default/replicas", json={"urls": fleet.urls})
            assert answer.status_code == 200, answer.text
            assert added.url in {r["url"] for r in answer.json()["replicas"]}
            start_s = await ready_since_s(gw, added.url)
            counts = []
            index = 1_000_000
            for end_s in WINDOW_ENDS:
                before_added, before_all = served(added), sum(served(r) for r in fleet.replicas)
                index += await stream_until(http, start_s + end_s, index)
                counts.append(
                    (served(added) - before_added, sum(served(r) for r in fleet.replicas) - before_all)
                )
            await assert_idle(gw)
    shares = [to_added / total for to_added, total in counts]
    print("added replica's share per window:", " ".join(f"{s:.3f}" for s in shares), "requests:", counts)
    fair = 1 / 3
    early, middle, late = share(counts[:1]), share(counts[1:3]), share(counts[3:])
    assert early < fair / 2, shares
    assert early < late and middle < late, shares
    assert late > fair / 2, shares
