"""Prefix-cache locality through the real gateway: the same shared-prefix trace, played through a
kvgate-policy gateway and a round-robin one, each in front of its own fresh simulated fleet, makes
the replicas' prefix caches hit far more often behind kvgate (measured from the replicas' own
``vllm:prefix_cache_*`` counters)."""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvgate.gateway.edge.server import running_gateway
from kvgate.loadtest.workload import Trace, build_trace
from kvgate.loadtest.workload_file import parse_workload
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, gateway_config

REPLICAS = 4
CONCURRENCY = 1
SHARED_PREFIX = parse_workload(
    {
        "name": "shared-prefix-small",
        "api": "chat",
        "concurrency": CONCURRENCY,
        "max_requests": 64,
        "classes": [
            {
                "name": "session",
                "system_prompts": 8,
                "system_prompt_tokens": {"uniform": [1000, 2000]},
                "turns": {"uniform": [2, 4]},
                "live_sessions": 8,
                "prompt_tokens": {"lognormal": {"median": 60, "sigma": 0.5, "min": 10, "max": 200}},
                "output_tokens": 4,
            }
        ],
    }
)
"""The ``shared-prefix`` preset scaled down: 8 system prompts shared by multi-turn sessions."""


async def prefix_counters(http: httpx.AsyncClient, urls: list[str]) -> tuple[float, float]:
    """``(hits, queries)`` in tokens, summed over the replicas' ``/metrics``."""
    hits = queries = 0.0
    for url in urls:
        text = (await http.get(url + "/metrics")).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "vllm:prefix_cache_hits_total":
                    hits += sample.value
                elif sample.name == "vllm:prefix_cache_queries_total":
                    queries += sample.value
    return hits, queries


async def hit_ratio(policy: str, trace: Trace) -> float:
    async with SimFleet(replicas=REPLICAS, time_scale=0.0, seed=0, overrides={"warmup_s": 0}) as fleet:
        routing = {"policy": policy, "warmup_s": 0}
        async with (
            running_gateway(gateway_config(fleet.urls, routing=routing)) as gw,
            httpx.AsyncClient(timeout=30) as http,
        ):
            pending = iter(trace.requests)

            async def worker() -> None:
                for request in pending:
                    answer = await http.post(
                        gw.url + request.path,
                        content=request.body(MODEL),
                        headers={"content-type": "application/json"},
                    )
                    assert answer.status_code == 200, answer.text

            await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
            await assert_idle(gw)
            hits, queries = await prefix_counters(http, fleet.urls)
    assert queries >= trace.prompt_tokens
    return hits / queries


async def test_kvgate_routing_beats_round_robin_on_the_replicas_prefix_cache_hit_rate() -> None:
    trace = build_trace(SHARED_PREFIX, seed=0)
    kvgate = await hit_ratio("kvgate", trace)
    round_robin = await hit_ratio("round_robin", trace)
    print(f"prefix hit rate: kvgate {kvgate:.3f}, round_robin {round_robin:.3f}, {kvgate / round_robin:.2f}x")
    assert kvgate >= 1.3 * round_robin
