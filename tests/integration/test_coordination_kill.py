"""A gateway killed (SIGKILL: no goodbye to Redis) in the middle of long streams gives its share of
the replica back within one lease: the surviving gateway, whose claim could not grow past what the
victim used, then claims the whole replica and admits what only the dead one's claim kept out.

"Within one lease" is read on Redis's clock, where the claims live: the victim's last claim expires
no later than one ``lease_s`` after it was killed, and the survivor gets the whole replica only once
Redis's clock has passed that expiry (a lapsed lease, not a goodbye). No bound on the test's own
clock: a loaded machine may take its time to notice."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import uuid
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio as aioredis

from kvgate.admission.claims import Share
from kvgate.gateway.coordination.claim_script import claims_key
from kvgate.gateway.edge.server import running_gateway
from kvgate.sim.fleet import SimFleet
from kvgate.sim.ports import free_ports
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config
from tests.integration.processes import serving_process, stop

KV_CAPACITY_TOKENS = 20000
LEASE_S = 1.0


async def redis_now_ms(redis: aioredis.Redis) -> int:
    """Redis's clock, in milliseconds, as the claims script reads it."""
    seconds, microseconds = await redis.time()
    return int(seconds) * 1000 + int(microseconds) // 1000


def body(max_tokens: int) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "x", "max_tokens": max_tokens, "ignore_eos": True}


async def test_a_killed_gateways_share_returns_within_its_lease(redis_url: str, tmp_path: Path) -> None:
    namespace = f"kvgate-test-{uuid.uuid4().hex[:8]}"
    async with SimFleet(replicas=1, time_scale=0.5, seed=0, overrides={"warmup_s": 0}) as fleet:
        pool = {"name": "default", "replicas": fleet.urls, "kv_capacity_tokens": KV_CAPACITY_TOKENS}
        coordination = {
            "redis_url": redis_url,
            "namespace": namespace,
            "interval_s": 0.05,
            "lease_s": LEASE_S,
        }
        config = gateway_config(
            fleet.urls,
            pools=[pool],
            routing={"warmup_s": 0},
            admission={"max_queue_wait_s": 1.0},
            coordination=coordination,
        )
        process_config = config.model_dump(mode="json")
        process_config["server"]["port"] = free_ports()
        process_config["coordination"]["redis_url"] = redis_url
        redis = aioredis.from_url(redis_url)
        async with (
            contextlib.aclosing(redis),
            running_gateway(config) as survivor,
            serving_process(tmp_path, process_config) as (victim_url, victim),
            httpx.AsyncClient(timeout=120) as http,
        ):
            coordinator = survivor.gateway.coordinator
            assert coordinator is not None
            replica = next(iter(survivor.state.replicas))

            def claim() -> Share:
                return coordinator.book.claimed().get(replica, Share())

            assert await eventually(lambda: claim().kv_tokens == KV_CAPACITY_TOKENS // 2)
            held = asyncio.create_task(http.post(victim_url + "/v1/completions", json=body(9000)))
            assert await eventually(lambda: coordinator.others_used().get(replica, 0) > 9000)
            refused = await http.post(survivor.url + "/v1/completions", json=body(12000))
            assert refused.status_code == 429, "its claim cannot grow past what the victim uses"
            assert claim().kv_tokens < KV_CAPACITY_TOKENS - 9000

            key = claims_key(namespace, replica)
            await stop(victim, signal.SIGKILL)
            killed_at_ms = await redis_now_ms(redis)
            fields = {k.decode(): v.decode() for k, v in (await redis.hgetall(key)).items()}
            fields.pop(coordinator.gateway_id)
            # The victim renewed every 50 ms until it died, so its claim is there, unless a stalled
            # machine let it lapse before the kill: then it was given back by the lease all the same.
            expires_at_ms = max((int(v.split()[-1]) for v in fields.values()), default=killed_at_ms)
            assert expires_at_ms <= killed_at_ms + LEASE_S * 1000, "its last claim lapses within one lease"
            assert await eventually(lambda: claim().kv_tokens == KV_CAPACITY_TOKENS, timeout_s=30.0)
            assert await redis_now_ms(redis) >= expires_at_ms, "given back by the lease lapsing"
            assert await redis.hkeys(key) == [coordinator.gateway_id.encode()], "the victim's claim is gone"
            late_body = {**body(12000), "stream": True}
            async with http.stream("POST", survivor.url + "/v1/completions", json=late_body) as late:
                assert late.status_code == 200  # admitted: the client need not wait for the rest
            await asyncio.gather(held, return_exceptions=True)
            await assert_idle(survivor)


async def test_a_request_no_claim_holds_waits_for_a_top_up_and_is_admitted(redis_url: str) -> None:
    """Two idle gateways hold half the replica each; a request for three quarters of it fits no
    claim and nothing its gateway holds would free room, yet the fleet has the room: its gateway
    tops its claim up at once (the idle one gives way at its next sync) and admits it."""
    namespace = f"kvgate-test-{uuid.uuid4().hex[:8]}"
    async with SimFleet(replicas=1, time_scale=0.0, seed=0, overrides={"warmup_s": 0}) as fleet:
        pool = {"name": "default", "replicas": fleet.urls, "kv_capacity_tokens": KV_CAPACITY_TOKENS}
        coordination = {"redis_url": redis_url, "namespace": namespace, "interval_s": 0.05}
        config = gateway_config(fleet.urls, pools=[pool], routing={"warmup_s": 0}, coordination=coordination)
        async with (
            running_gateway(config) as a,
            running_gateway(config) as b,
            httpx.AsyncClient(timeout=60) as http,
        ):
            replica = next(iter(a.state.replicas))
            for gw in (a, b):
                coordinator = gw.gateway.coordinator
                assert coordinator is not None
                assert await eventually(
                    lambda c=coordinator: (
                        c.book.claimed().get(replica, Share()).kv_tokens == KV_CAPACITY_TOKENS // 2
                    )
                )
            answer = await http.post(b.url + "/v1/completions", json=body(KV_CAPACITY_TOKENS * 3 // 4))
            assert answer.status_code == 200, answer.text
            for gw in (a, b):
                await assert_idle(gw)
