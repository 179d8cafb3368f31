"""Gateways claiming one replica through a real Redis server: the claims never sum past its
capacity, a busy gateway gets its fair share from an idle one, and a dead gateway's claim lapses."""

from __future__ import annotations

import asyncio
import uuid

from kvgate.admission.claims import ReplicaDemand, Share
from kvgate.gateway.coordination.coordinator import RedisCoordinator
from kvgate.vocabulary.replica import ReplicaLoad

CAPACITY = Share(1000, 10)


def coordinator(redis_url: str, namespace: str, demand: dict[str, ReplicaDemand]) -> RedisCoordinator:
    return RedisCoordinator(redis_url, lambda: demand, interval_s=0.05, lease_s=0.4, namespace=namespace)


def claimed(c: RedisCoordinator) -> Share:
    return c.book.claimed().get("r0", Share())


async def test_claims_share_a_replica_fairly_and_a_dead_gateways_claim_lapses(redis_url: str) -> None:
    namespace = f"kvgate-test-{uuid.uuid4().hex[:8]}"
    demand_a = {"r0": ReplicaDemand(CAPACITY, Share())}
    demand_b = {"r0": ReplicaDemand(CAPACITY, Share())}
    a = coordinator(redis_url, namespace, demand_a)
    b = coordinator(redis_url, namespace, demand_b)
    await a.start()
    assert claimed(a) == CAPACITY, "alone, a gateway claims the whole replica"
    await b.start()
    try:
        assert a.connected and b.connected
        assert claimed(b) == Share(), "the first one holds it all until it hears of the second"
        await a.sync_once()  # a hears of b ...
        await a.sync_once()  # ... and gives back what b may want
        await b.sync_once()
        assert claimed(a) == claimed(b) == Share(500, 5)
        assert a.foreign_loads()["r0"] == ReplicaLoad(0, 5, 0, 500)
        assert b.foreign_loads()["unknown"].reserved_kv_tokens > CAPACITY.kv_tokens

        # Each sizes its claim on what the others wanted at its previous sync: two rounds settle it.
        demand_a["r0"] = ReplicaDemand(CAPACITY, Share(400, 4), Share(600, 6))
        for _ in range(2):
            await a.sync_once()
            await b.sync_once()
        await a.sync_once()
        assert claimed(b) == Share(), "an idle gateway gives way to a busy one"
        assert b.others_used() == {"r0": 400}, "what a uses, not what it claims, is its occupancy"
        assert claimed(a) == CAPACITY

        demand_b["r0"] = ReplicaDemand(CAPACITY, Share(), Share(1000, 10))
        for _ in range(2):
            await b.sync_once()
            await a.sync_once()
        await b.sync_once()
        assert claimed(a) == claimed(b) == Share(500, 5), "two busy gateways split it evenly"

        assert a._task is not None
        a._task.cancel()  # a crashes: it stops renewing its claim without giving it back
        await asyncio.sleep(0.5)
        await b.sync_once()
        await b.sync_once()
        assert claimed(b) == CAPACITY
    finally:
        await b.stop()
        await a.stop()


async def test_unreachable_redis_leaves_the_gateway_on_local_state() -> None:
    coordinator = RedisCoordinator("redis://127.0.0.1:1/0", dict, interval_s=0.05, lease_s=0.2)
    await coordinator.start()
    try:
        assert not coordinator.connected
        assert coordinator.foreign_loads() == {}
    finally:
        await coordinator.stop()
