"""A Retry-After from any gateway is honoured by all: gateway a refuses a request with a promised
slot; its client comes back to gateway b (a Service picks any), which knows the promise from Redis:
early, b names the same slot; once there is room, b admits it as the promise's claimant, and a drops
the promise as kept elsewhere instead of holding room for it until it lapses."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

import httpx

from kvgate.admission.tokenizer import TiktokenTokenizer
from kvgate.gateway.edge.server import RunningGateway, running_gateway
from kvgate.sim.fleet import SimFleet
from kvgate.vocabulary.replica import ReplicaLoad
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config

PROMPT = "Tell a long story about a gateway and its replicas."
PROMPT_TOKENS = TiktokenTokenizer.from_name().count(PROMPT)
HOLD_MAX_TOKENS = 2000
KV_CAPACITY_TOKENS = 2 * (PROMPT_TOKENS + HOLD_MAX_TOKENS) + 50
"""Room for one holder per gateway, and not for the short request beside them."""


def body(max_tokens: int) -> dict[str, Any]:
    return {"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True}


def promised(gw: RunningGateway, now_s: float) -> int:
    return gw.gateway.path.dispatcher.controller.queue_stats(now_s).promised_requests


async def test_a_promise_made_by_one_gateway_is_kept_by_another(redis_url: str) -> None:
    namespace = f"kvgate-test-{uuid.uuid4().hex[:8]}"
    async with SimFleet(replicas=1, time_scale=0.2, seed=0, overrides={"warmup_s": 0}) as fleet:
        config = gateway_config(
            fleet.urls,
            pools=[{"name": "default", "replicas": fleet.urls, "kv_capacity_tokens": KV_CAPACITY_TOKENS}],
            routing={"warmup_s": 0},
            admission={"max_queue_wait_s": 0.05, "retry_after_cap_s": 120},
            coordination={"redis_url": redis_url, "namespace": namespace, "interval_s": 0.05, "lease_s": 2.0},
        )
        async with contextlib.AsyncExitStack() as stack, httpx.AsyncClient(timeout=120) as http:
            a, b = [await stack.enter_async_context(running_gateway(config)) for _ in range(2)]
            replica = next(iter(a.state.replicas))
            for gw in (a, b):
                coordinator = gw.gateway.coordinator
                assert coordinator is not None
                assert await eventually(
                    lambda c=coordinator: (
                        c.book.claimed().get(replica, None) is not None
                        and c.book.claimed()[replica].kv_tokens >= PROMPT_TOKENS + HOLD_MAX_TOKENS
                    )
                )
            holders = []
            for gw in (a, b):
                url = gw.url + "/v1/completions"
                holders.append(asyncio.create_task(http.post(url, json=body(HOLD_MAX_TOKENS))))
                assert await eventually(lambda g=gw: g.state.ledger.load(replica).resident_sequences == 1)

            headers = {"idempotency-key": "story-42"}
            first = await http.post(a.url + "/v1/completions", json=body(100), headers=headers)
            assert first.status_code == 429, first.text
            first_wait_s = int(first.headers["retry-after-ms"]) / 1000.0
            assert promised(a, 0.0) == 1
            b_coordinator = b.gateway.coordinator
            assert b_coordinator is not None
            assert await eventually(lambda: bool(b_coordinator.shared_promises.learnt))

            loop = asyncio.get_running_loop()
            asked_at_s = loop.time()
            early = await http.post(b.url + "/v1/completions", json=body(100), headers=headers)
            assert early.status_code == 429, early.text
            early_wait_s = int(early.headers["retry-after-ms"]) / 1000.0
            assert early_wait_s <= first_wait_s
            assert abs(early_wait_s - first_wait_s) < 2.0 + (loop.time() - asked_at_s), (
                "b names the slot a promised, not a wait of its own"
            )
            assert promised(b, 0.0) == 0, "b sets no room aside for a's promise"

            for holder in holders:
                holder.cancel()
            await asyncio.gather(*holders, return_exceptions=True)
            for gw in (a, b):  # not assert_idle yet: it lets every promise lapse
                assert await eventually(lambda g=gw: g.state.ledger.totals() == ReplicaLoad())
            kept = await http.post(b.url + "/v1/completions", json=body(100), headers=headers)
            assert kept.status_code == 200, kept.text
            assert b.gateway.path.dispatcher.controller.promise_counts.kept == 1
            assert await eventually(lambda: promised(a, 0.0) == 0), "a drops it as kept elsewhere"
            assert a.gateway.path.dispatcher.controller.promise_counts.lapsed == 0
            for gw in (a, b):
                await assert_idle(gw)
