"""The gateway follows its replicas' KV cache events over real ZMQ: what routing believes a replica
holds is what its prefix cache holds, evictions included, and a replica publishing nothing is routed
on what kvgate sent it, told apart on ``/metrics``.

The replicas are the simulator's, publishing vLLM 0.32's wire format (``kvgate.sim.kv_publisher``);
the gateway finds where each publishes through ``GET /kv_event_sources``, as with vLLM.
"""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvgate.gateway.edge.server import RunningGateway, running_gateway
from kvgate.routing.prefix_hash import block_hashes
from kvgate.sim.fleet import SimFleet
from kvgate.sim.kv_publisher import KvEventsConfig
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config
from tests.integration.test_access_log import Stderr

CACHE_TOKENS = 4_096
"""A replica's KV cache: a few prompts of 1,000 tokens fill it, so later ones evict earlier ones."""


def metric(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def prompt(word: str, tokens: int = 1_000) -> str:
    return " ".join(f"{word}{i % 7}" for i in range(tokens))


async def complete(http: httpx.AsyncClient, gw: RunningGateway, text: str) -> None:
    body = {"model": MODEL, "prompt": text, "max_tokens": 4}
    answer = await http.post(gw.url + "/v1/completions", json=body)
    assert answer.status_code == 200, answer.text


OVERRIDES = {"warmup_s": 0, "kv_capacity_tokens": CACHE_TOKENS}


async def test_routing_reads_a_replicas_cache_from_its_events_evictions_included() -> None:
    async with SimFleet(replicas=1, time_scale=0.0, overrides=OVERRIDES, kv_events=KvEventsConfig()) as fleet:
        pools = [{"name": "default", "replicas": fleet.urls, "kv_capacity_tokens": CACHE_TOKENS}]
        config = gateway_config(fleet.urls, pools=pools, routing={"warmup_s": 0})
        async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:
            cache = gw.gateway.path.dispatcher.router.cache
            replica_id = next(iter(gw.state.replicas))
            assert await eventually(lambda: cache.follows(replica_id))
            engine = fleet.replicas[0].engine
            first = prompt("alpha")
            hashes = block_hashes(fleet.replicas[0]._prompts.tokenizer.encode(first), 16)

            def held() -> int:
                return cache.match(replica_id, hashes, float("inf")).gpu_blocks

            def real() -> int:
                return len(engine.pool.cached_prefix(hashes))

            await complete(http, gw, first)
            assert real() == len(hashes) - 1 or real() == len(hashes)
            assert await eventually(lambda: held() == real())
            for word in ("beta", "gamma", "delta", "epsilon", "zeta", "eta"):
                await complete(http, gw, prompt(word))
            assert real() < len(hashes) - 1, "four prompts fill the cache: the first was evicted"
            assert await eventually(lambda: held() == real()), (held(), real())
            page = (await http.get(gw.url + "/metrics")).text
            assert metric(page, "kvgate_kv_events_total", outcome="stored") > 0
            assert metric(page, "kvgate_kv_events_total", outcome="removed") > 0
            await assert_idle(gw)


async def test_a_replica_publishing_nothing_is_routed_on_what_kvgate_sent_it_and_told_apart() -> None:
    async with (
        SimFleet(replicas=1, time_scale=0.0, overrides=OVERRIDES, kv_events=KvEventsConfig()) as fleet,
        SimFleet(replicas=1, time_scale=0.0, overrides=OVERRIDES) as silent,
    ):
        urls = [*fleet.urls, *silent.urls]
        pools = [{"name": "default", "replicas": urls, "kv_capacity_tokens": CACHE_TOKENS}]
        async with running_gateway(gateway_config(urls, pools=pools)) as gw, httpx.AsyncClient() as http:
            cache = gw.gateway.path.dispatcher.router.cache
            by_url = {r.url: r.replica_id for r in gw.state.replicas.values()}
            assert await eventually(lambda: cache.follows(by_url[fleet.urls[0]]))
            assert not cache.follows(by_url[silent.urls[0]])
            page = (await http.get(gw.url + "/metrics")).text
            assert metric(page, "kvgate_prefix_cache_replicas", source="events") == 1
            assert metric(page, "kvgate_prefix_cache_replicas", source="routed") == 1
        off = [{"name": "default", "replicas": urls, "kv_capacity_tokens": CACHE_TOKENS, "kv_events": "off"}]
        async with running_gateway(gateway_config(urls, pools=off)) as gw:
            cache = gw.gateway.path.dispatcher.router.cache
            assert not any(cache.follows(r) for r in gw.state.replicas)


async def test_the_hit_routing_expects_is_the_hit_the_replica_reports(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Request by request, through evictions, the access log's ``cached_tokens_expected`` (what the
    index says the chosen replica holds) equals the ``cached_tokens`` the replica reports."""
    err = Stderr(capsys)
    async with SimFleet(
        replicas=1,
        time_scale=0.0,
        overrides=OVERRIDES,
        kv_events=KvEventsConfig(),
        prompt_tokens_details=True,
    ) as fleet:
        pools = [{"name": "default", "replicas": fleet.urls, "kv_capacity_tokens": CACHE_TOKENS}]
        config = gateway_config(fleet.urls, pools=pools, routing={"warmup_s": 0})
        async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:
            cache = gw.gateway.path.dispatcher.router.cache
            replica_id = next(iter(gw.state.replicas))
            assert await eventually(lambda: cache.follows(replica_id))
            engine = fleet.replicas[0].engine
            encode = fleet.replicas[0]._prompts.tokenizer.encode
            sends = [("alpha", 900), ("alpha", 950), ("beta", 900), ("gamma", 500), ("alpha", 1000)]
            sends += [("delta", 900), ("epsilon", 900), ("alpha", 1000), ("beta", 900)]
            for sent, (word, words) in enumerate(sends, 1):
                text = prompt(word, words)
                await complete(http, gw, text)
                hashes = block_hashes(encode(text), 16)
                # The next request is routed once the index has heard this one's events.
                assert await eventually(
                    lambda h=hashes: (
                        cache.match(replica_id, h, float("inf")).gpu_blocks
                        == len(engine.pool.cached_prefix(h))
                    )
                )
                assert await eventually(lambda n=sent: len(err.access()) == n)
            records = err.access()
            expected = [r["cached_tokens_expected"] for r in records]
            reported = [r["cached_tokens"] for r in records]
            assert expected == reported
            assert reported[0] == 0 and reported[1] > 0, "a repeated prompt hits"
            assert 0 < reported[4] < reported[1], "part of the first prompt was evicted in between"
            await assert_idle(gw)
