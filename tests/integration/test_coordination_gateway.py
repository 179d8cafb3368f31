"""Two real gateways in front of the same simulated replica, sharing reservations through a real
Redis: what gateway A reserved is in gateway B's view of the replica, so B queues a request that
only A's reservations keep out (its own ledger is empty), and dispatches it once A's streams end."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx

from admission.tokenizer import TiktokenTokenizer
from gateway.server import RunningGateway, running_gateway
from loadtest.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config
from vocabulary.replica import ReplicaLoad

KV_CAPACITY_TOKENS = 20000
HOLD_MAX_TOKENS = 9000
HOLDERS = 2
PROMPT = "Tell a long story about a gateway and its replicas."
PROMPT_TOKENS = TiktokenTokenizer.from_name().count(PROMPT)
LATE_MAX_TOKENS = KV_CAPACITY_TOKENS - HOLDERS * (PROMPT_TOKENS + HOLD_MAX_TOKENS) - PROMPT_TOKENS + 1
"""Just more than the room A's reservations leave: fits an empty replica, not one A holds."""
FAST_SYNC = {"interval_s": 0.05, "lease_s": 2.0}


def config_for(fleet: SimFleet, redis_url: str, namespace: str) -> Any:
    pool = {"name": "default", "replicas": fleet.urls, "kv_capacity_tokens": KV_CAPACITY_TOKENS}
    return gateway_config(
        fleet.urls,
        pools=[pool],
        routing={"warmup_s": 0},
        admission={"max_queue_wait_s": 60},
        coordination={"redis_url": redis_url, "namespace": namespace, **FAST_SYNC},
    )


def completion(max_tokens: int) -> dict[str, Any]:
    return {"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True}


def seen_load(gw: RunningGateway, replica_id: str) -> ReplicaLoad:
    """The load ``gw`` decides on for ``replica_id``: its own ledger plus the other gateways'."""
    now_s = time.monotonic()
    return next(v.load for v in gw.gateway.path.fleet.views(now_s) if v.replica_id == replica_id)


async def test_reservations_through_one_gateway_hold_requests_back_at_the_other(redis_url: str) -> None:
    async with SimFleet(replicas=1, time_scale=0.1, seed=0, overrides={"warmup_s": 0}) as fleet:
        config = config_for(fleet, redis_url, f"kvgate-test-{uuid.uuid4().hex[:8]}")
        replica = fleet.urls[0]
        async with (
            running_gateway(config) as gw_a,
            running_gateway(config) as gw_b,
            httpx.AsyncClient(timeout=60) as http,
        ):
            assert gw_a.gateway.coordinator is not None and gw_a.gateway.coordinator.connected
            assert gw_b.gateway.coordinator is not None and gw_b.gateway.coordinator.connected
            holders = [
                asyncio.create_task(http.post(gw_a.url + "/v1/completions", json=completion(HOLD_MAX_TOKENS)))
                for _ in range(HOLDERS)
            ]
            assert await eventually(lambda: gw_a.state.ledger.load(replica).resident_sequences == HOLDERS)
            held = gw_a.state.ledger.load(replica)
            assert held.reserved_kv_tokens == HOLDERS * (PROMPT_TOKENS + HOLD_MAX_TOKENS)
            assert await eventually(
                lambda: seen_load(gw_b, replica).reserved_kv_tokens == held.reserved_kv_tokens
            )
            assert seen_load(gw_b, replica).resident_sequences == HOLDERS
            assert gw_b.state.ledger.load(replica) == ReplicaLoad()

            late = asyncio.create_task(
                http.post(gw_b.url + "/v1/completions", json=completion(LATE_MAX_TOKENS))
            )
            assert await eventually(lambda: gw_b.state.queued == 1)
            assert gw_b.state.ledger.load(replica) == ReplicaLoad()
            assert not late.done()

            for holder in holders:
                holder.cancel()
            await asyncio.gather(*holders, return_exceptions=True)
            await assert_idle(gw_a)
            answer = await late
            assert answer.status_code == 200, answer.text
            assert answer.json()["usage"]["completion_tokens"] == LATE_MAX_TOKENS
            await assert_idle(gw_b)
            assert await eventually(lambda: seen_load(gw_a, replica) == ReplicaLoad())
