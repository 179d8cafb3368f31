"""Two gateways sharing reservations through a real Redis server."""

from __future__ import annotations

import asyncio
import uuid

from gateway.coordination import RedisCoordinator
from vocabulary.replica import ReplicaLoad


async def test_each_gateway_sees_the_others_load_and_a_dead_ones_expires(redis_url: str) -> None:
    namespace = f"kvgate-test-{uuid.uuid4().hex[:8]}"
    load_a = {"r0": ReplicaLoad(100, 1, 50, 150)}
    load_b = {"r0": ReplicaLoad(10, 2, 20, 30), "r1": ReplicaLoad(0, 1, 5, 5)}
    a = RedisCoordinator(redis_url, lambda: load_a, interval_s=0.05, lease_s=0.4, namespace=namespace)
    b = RedisCoordinator(redis_url, lambda: load_b, interval_s=0.05, lease_s=0.4, namespace=namespace)
    await a.start()
    await b.start()
    try:
        await a.sync_once()
        assert a.connected and b.connected
        assert a.foreign_loads() == load_b
        assert b.foreign_loads() == load_a

        load_a["r0"] = ReplicaLoad()
        await a.sync_once()
        await b.sync_once()
        assert b.foreign_loads()["r0"] == ReplicaLoad()

        assert a._task is not None
        a._task.cancel()  # a crashes: it stops renewing its lease without deleting its key
        await asyncio.sleep(0.6)
        await b.sync_once()
        assert b.foreign_loads() == {}
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
