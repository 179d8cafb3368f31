"""The gateway's prefix-cache index fed by a real vLLM's KV events: for every request, the prompt
tokens routing expected the replica to find in its cache (``cached_tokens_expected`` in the access
log) are the tokens vLLM says it found (``usage.prompt_tokens_details.cached_tokens``), through
evictions of a cache a few prompts fill.

The replica publishes over ZMQ as vLLM does in production (``--kv-events-config``); the gateway
finds the endpoint through vLLM's own ``GET /kv_event_sources``. Its cache is 80 blocks of 32
tokens (one, the null block, unused), so the index must follow vLLM's ``BlockRemoved`` events too.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvgate.sim.ports import free_ports
from tests.integration.processes import assert_process_idle, serving_process
from tests.vllm.conftest import SpareReplica, gateway_config, metric_total
from tests.vllm.servers import SERVED_MODEL

pytestmark = pytest.mark.vllm

BLOCK_TOKENS = 32
"""The smallest block vLLM's CPU attention takes (a multiple of 32)."""
CACHE_BLOCKS = 80
MAX_MODEL_LEN = 2048


def prompt(family: int, tokens: int) -> list[int]:
    """Token ids (a prompt vLLM takes as they are): a family's prompts share their prefix, two
    families share nothing."""
    return [8 + (family * 53 + i * 7) % 300 for i in range(tokens)]


async def events_settled(url: str) -> None:
    """Wait until the gateway has applied every event the replica published so far: its count of
    applied events stops moving for a while (vLLM publishes a step's events as the step ends)."""
    last, still = -1.0, 0
    for _ in range(200):
        seen = await metric_total(url, "kvgate_kv_events_total")
        still = still + 1 if seen == last else 0
        if still >= 5:
            return
        last = seen
        await asyncio.sleep(0.05)
    raise AssertionError("the gateway's event count never settled")


async def test_the_hit_routing_expects_is_the_hit_vllm_reports(
    spare_replica: SpareReplica, tmp_path: Path
) -> None:
    events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{free_ports()}",
        "topic": "kv-events",
    }
    flags = (
        *("--block-size", str(BLOCK_TOKENS), "--num-gpu-blocks-override", str(CACHE_BLOCKS)),
        *("--max-model-len", str(MAX_MODEL_LEN), "--enable-prompt-tokens-details"),
        *("--kv-events-config", json.dumps(events)),
    )
    with spare_replica(*flags) as replica:
        config = gateway_config([replica.url], routing={"warmup_s": 0, "block_size_tokens": BLOCK_TOKENS})
        config["models"][0]["max_model_len"] = MAX_MODEL_LEN
        log_path = tmp_path / "stderr.log"
        with log_path.open("wb") as log:
            async with serving_process(tmp_path, config, stderr=log) as (url, process):
                for _ in range(100):
                    if await metric_total(url, "kvgate_prefix_cache_replicas") == 1.0:
                        break
                    await asyncio.sleep(0.1)
                # 2,528 tokens of cache: two of these prompts fit, a third evicts.
                sends = [(0, 1100), (0, 1150), (1, 1100), (2, 600), (0, 1200)]
                sends += [(3, 1100), (4, 1100), (0, 1200), (1, 1100)]
                async with aiohttp.ClientSession() as http:
                    for family, tokens in sends:
                        body = {"model": SERVED_MODEL, "prompt": prompt(family, tokens), "max_tokens": 4}
                        async with http.post(url + "/v1/completions", json=body) as answer:
                            assert answer.status == 200, await answer.text()
                        await events_settled(url)
                outcomes = await event_outcomes(url)
                await assert_process_idle(url)
                process.terminate()
                await process.wait()
        records = access_records(log_path)
    assert len(records) == len(sends)
    expected = [r["cached_tokens_expected"] for r in records]
    reported = [r["cached_tokens"] for r in records]
    assert expected == reported, (expected, reported)
    assert reported[0] == 0 and reported[1] > 0, "a repeated prompt hits"
    assert any(0 < later < reported[1] for later in reported[4:]), ("an eviction cut a prefix", reported)
    assert outcomes.get("stored", 0) > 0 and outcomes.get("removed", 0) > 0, outcomes


async def event_outcomes(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as response:
        page = await response.text()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == "kvgate_kv_events_total":
                outcome = sample.labels["outcome"]
                totals[outcome] = totals.get(outcome, 0.0) + sample.value
    return totals


def access_records(path: Path) -> list[dict[str, Any]]:
    lines = [line for line in path.read_text().splitlines() if line.startswith("{")]
    return [r for r in map(json.loads, lines) if r.get("event") == "access"]
