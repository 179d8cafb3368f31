"""Work signals from the live gateway: ``/signals`` and ``/metrics`` carry queued, pending and
resident work while requests run, the KV occupancy estimate bounds what the replica really holds,
and every work gauge is back to zero when the load is gone."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx

from kvgate.gateway.edge.server import running_gateway
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config

KV_CAPACITY_TOKENS = 4000
MAX_SEQS = 4
BLOCK_TOKENS = 16


def gauge(metrics: str, name: str) -> float:
    values = [float(v) for v in re.findall(rf"^{name}{{[^}}]*}} (\S+)$", metrics, re.MULTILINE)]
    assert values, f"{name} missing from /metrics"
    return sum(values)


async def test_work_signals_during_load_and_zero_after() -> None:
    overrides = {"warmup_s": 0, "kv_capacity_tokens": KV_CAPACITY_TOKENS, "max_num_seqs": MAX_SEQS}
    async with SimFleet(replicas=1, time_scale=1.0, seed=0, overrides=overrides) as fleet:
        pool = {
            "name": "default",
            "replicas": fleet.urls,
            "kv_capacity_tokens": KV_CAPACITY_TOKENS,
            "max_sequences": MAX_SEQS,
        }
        config = gateway_config(
            fleet.urls, pools=[pool], admission={"max_queue_wait_s": 300}, health={"interval_s": 0.1}
        )
        async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url, timeout=60) as http:
            body: dict[str, Any] = {"model": MODEL, "prompt": "tell a long story", "max_tokens": 250}
            body["ignore_eos"] = True
            body["stream"] = True  # a stream's first token is what TTFT counts
            load = [asyncio.create_task(http.post("/v1/completions", json=body)) for _ in range(MAX_SEQS + 2)]
            assert await eventually(lambda: gw.state.queued == 2)
            engine = fleet.replicas[0].engine
            assert await eventually(lambda: engine.kv_cache_usage_ratio > 0.05)
            signals = (await http.get("/signals")).json()
            pool_doc = signals["pools"]["default"]
            assert pool_doc["resident_sequences"] == MAX_SEQS
            assert pool_doc["queued_requests"] == 2
            assert pool_doc["queued_prompt_tokens"] > 0
            assert pool_doc["remaining_decode_tokens"] > 0
            estimate = pool_doc["kv_occupancy_estimate_ratio"]
            assert engine.kv_cache_usage_ratio <= estimate + MAX_SEQS * BLOCK_TOKENS / KV_CAPACITY_TOKENS
            assert estimate <= 1.0
            replica = gw.state.replicas[fleet.urls[0]]
            assert await eventually(
                lambda: replica.scraped is not None and replica.scraped.kv_cache_usage_ratio > 0
            )
            assert replica.scraped is not None
            slack = MAX_SEQS * BLOCK_TOKENS / KV_CAPACITY_TOKENS
            assert replica.scraped.kv_cache_usage_ratio <= estimate + slack, "the estimate is the worst case"
            before = replica.scraped.kv_cache_usage_ratio
            metrics = (await http.get("/metrics")).text
            after = replica.scraped.kv_cache_usage_ratio
            scraped_line = r'^kvgate_replica_kv_occupancy_ratio{[^}]*source="scraped"[^}]*} (\S+)$'
            exported = re.findall(scraped_line, metrics, re.MULTILINE)
            assert [float(v) for v in exported] in ([before], [after]), "the replica's own value, as scraped"
            assert gauge(metrics, "kvgate_resident_sequences") == MAX_SEQS
            assert gauge(metrics, "kvgate_queued_requests") == 2
            answers = await asyncio.gather(*load)
            assert [a.status_code for a in answers] == [200] * (MAX_SEQS + 2)
            await assert_idle(gw)
            metrics = (await http.get("/metrics")).text
            for name in (
                "kvgate_queued_requests",
                "kvgate_queued_prompt_tokens",
                "kvgate_pending_prompt_tokens",
                "kvgate_resident_sequences",
                "kvgate_remaining_decode_tokens",
            ):
                assert gauge(metrics, name) == 0, name
            assert gauge(metrics, "kvgate_time_to_first_token_seconds_count") == MAX_SEQS + 2
            replica_metrics = (await http.get(fleet.urls[0] + "/metrics")).text
            for ours, theirs in (
                ("kvgate_prompt_tokens_total", "vllm:prompt_tokens_total"),
                ("kvgate_output_tokens_total", "vllm:generation_tokens_total"),
            ):
                assert gauge(metrics, ours) == gauge(replica_metrics, theirs) > 0, (ours, theirs)
            signals = (await http.get("/signals")).json()
            pool_doc = signals["pools"]["default"]
            assert pool_doc["resident_sequences"] == pool_doc["queued_requests"] == 0
            assert pool_doc["kv_occupancy_estimate_ratio"] == 0
            assert pool_doc["decisions"]["queue"] == 2
            assert pool_doc["ttft_p95_s"] is not None
