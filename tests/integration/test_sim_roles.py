"""Prefill, decode and mixed replicas on loopback: what a P/D-aware gateway can observe."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvgate.sim.fleet import DEFAULT_MODEL, SimFleet
from kvgate.sim.replica import SimReplica

SMALL = {"kv_capacity_tokens": 20_000, "max_num_seqs": 8, "warmup_s": 0}
LONG_PROMPT = " word" * 6000


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def _complete(http: aiohttp.ClientSession, replica: SimReplica, **body: Any) -> dict[str, Any]:
    async with http.post(f"{replica.url}/v1/completions", json={"model": DEFAULT_MODEL, **body}) as r:
        assert r.status == 200, await r.text()
        answer: dict[str, Any] = await r.json()
        return answer


async def _ttft_s(http: aiohttp.ClientSession, replica: SimReplica, **body: Any) -> float:
    before = replica.engine.stats.ttft_s.sum
    await _complete(http, replica, prompt=LONG_PROMPT, max_tokens=8, ignore_eos=True, **body)
    return replica.engine.stats.ttft_s.sum - before


async def test_prefill_replica_answers_one_token_hands_off_its_kv_and_says_its_role(
    http: aiohttp.ClientSession,
) -> None:
    async with SimFleet(replicas=1, time_scale=0.0, overrides=SMALL, role="prefill") as sim:
        replica = sim.replicas[0]
        answer = await _complete(http, replica, prompt=LONG_PROMPT, max_tokens=200)
        assert answer["usage"]["completion_tokens"] == 1
        assert answer["choices"][0]["finish_reason"] == "length"
        params = answer["kv_transfer_params"]
        assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
        assert params["remote_port"] == replica.port
        assert replica.engine.kv_cache_usage_ratio == 0.0
        body = {"model": DEFAULT_MODEL, "prompt": "hi", "max_tokens": 50, "stream": True}
        async with http.post(f"{replica.url}/v1/completions", json=body) as r:
            events = [line for line in (await r.read()).split(b"\n\n") if line]
        assert len(events) == 2 and events[-1] == b"data: [DONE]"
        async with http.get(f"{replica.url}/metrics") as r:
            page = await r.text()
        samples = {
            (s.name, s.labels.get("role")): s.value
            for f in text_string_to_metric_families(page)
            for s in f.samples
        }
        assert samples[("kvgate_sim_role_info", "prefill")] == 1.0
        assert samples[("vllm:kv_cache_usage_perc", None)] == 0.0
        assert samples[("vllm:generation_tokens_total", None)] == 2.0


async def test_decode_replica_skips_the_prefill_only_when_the_kv_was_transferred(
    http: aiohttp.ClientSession,
) -> None:
    async with SimFleet(replicas=0, time_scale=0.0, overrides=SMALL) as sim:
        prefill = await sim.add_replica(role="prefill")
        mixed = await sim.add_replica()
        decode = await sim.add_replica(role="decode")
        decode_plain = await sim.add_replica(role="decode")
        handoff = await _complete(http, prefill, prompt=LONG_PROMPT, max_tokens=1)
        params = handoff["kv_transfer_params"]
        mixed_ttft_s = await _ttft_s(http, mixed, kv_transfer_params=params)
        decode_ttft_s = await _ttft_s(http, decode, kv_transfer_params=params)
        plain_ttft_s = await _ttft_s(http, decode_plain)
        assert decode_ttft_s * 10 < mixed_ttft_s
        assert plain_ttft_s == pytest.approx(mixed_ttft_s)
        handoff = await _complete(http, prefill, prompt=LONG_PROMPT + " more", max_tokens=1)
        answer = await _complete(
            http,
            decode,
            prompt=LONG_PROMPT + " more",
            max_tokens=30,
            ignore_eos=True,
            kv_transfer_params=handoff["kv_transfer_params"],
        )
        assert answer["usage"]["completion_tokens"] == 30 and answer["kv_transfer_params"] is None
        assert decode.engine.kv_cache_usage_ratio == 0.0


async def _decode_status(
    http: aiohttp.ClientSession, decode: SimReplica, params: dict[str, Any], stream: bool = False
) -> tuple[int, bytes]:
    body = {
        "model": DEFAULT_MODEL,
        "prompt": "hi",
        "max_tokens": 4,
        "stream": stream,
        "kv_transfer_params": params,
    }
    async with http.post(f"{decode.url}/v1/completions", json=body) as r:
        return r.status, await r.read()


async def test_a_transfer_is_pulled_once_and_a_failed_pull_fails_the_request_as_vllm_does(
    http: aiohttp.ClientSession,
) -> None:
    async with SimFleet(replicas=0, time_scale=0.0, overrides=SMALL) as sim:
        prefill = await sim.add_replica(role="prefill")
        decode = await sim.add_replica(role="decode")
        params = (await _complete(http, prefill, prompt="hi", max_tokens=1))["kv_transfer_params"]
        assert set(params) >= {"remote_engine_id", "remote_block_ids", "remote_host", "remote_port"}
        assert (await _decode_status(http, decode, params))[0] == 200
        status, body = await _decode_status(http, decode, params)
        assert status == 500 and b"already pulled" in body
        status, body = await _decode_status(http, decode, {**params, "remote_request_id": "nope"})
        assert status == 500 and b"unknown" in body
        status, body = await _decode_status(http, decode, params, stream=True)
        events = [e for e in body.split(b"\n\n") if e]
        assert status == 200 and b'"error"' in events[0] and events[-1] == b"data: [DONE]"
        status, body = await _decode_status(http, decode, {"do_remote_prefill": True})
        assert status == 400 and b"remote_host" in body
        params = (await _complete(http, prefill, prompt="hi", max_tokens=1))["kv_transfer_params"]
        prefill.kill()
        status, body = await _decode_status(http, decode, params)
        assert status == 500 and b"cannot reach the prefill instance" in body
        assert decode.engine.kv_cache_usage_ratio == 0.0 and not decode.engine.has_work


async def test_a_transfer_not_pulled_in_time_expires() -> None:
    async with (
        aiohttp.ClientSession() as http,
        SimFleet(replicas=0, time_scale=0.0, overrides={**SMALL, "kv_transfer_timeout_s": 0.0}) as sim,
    ):
        prefill = await sim.add_replica(role="prefill")
        decode = await sim.add_replica(role="decode")
        params = (await _complete(http, prefill, prompt="hi", max_tokens=1))["kv_transfer_params"]
        status, body = await _decode_status(http, decode, params)
        assert status == 500 and b"expired" in body


async def test_the_decode_replica_charges_the_transfer_time_over_the_link(
    http: aiohttp.ClientSession,
) -> None:
    slow_link = {**SMALL, "kv_link_bytes_per_s": 1e9}
    async with SimFleet(replicas=0, time_scale=1.0, overrides=slow_link) as sim:
        prefill = await sim.add_replica(role="prefill")
        decode = await sim.add_replica(role="decode")
        handoff = await _complete(http, prefill, prompt=LONG_PROMPT, max_tokens=1)
        params = handoff["kv_transfer_params"]
        loop = asyncio.get_running_loop()
        started_s = loop.time()
        assert (await _decode_status(http, decode, params))[0] == 200
        moved_bytes = handoff["usage"]["prompt_tokens"] * decode.profile.kv_bytes_per_token
        assert loop.time() - started_s >= moved_bytes / 1e9


async def test_control_api_adds_replicas_by_role(http: aiohttp.ClientSession) -> None:
    async with SimFleet(replicas=1, time_scale=0.0, overrides=SMALL, control_port=0, role="decode") as sim:
        control = f"{sim.control_url}/replicas"
        async with http.post(control, json={"cold_start_s": 0, "role": "prefill"}) as r:
            assert r.status == 201 and (await r.json())["role"] == "prefill"
        async with http.post(control, json={"role": "both"}) as r:
            assert r.status == 400 and "mixed, prefill, decode" in (await r.json())["detail"]
        async with http.get(control) as r:
            assert [x["role"] for x in (await r.json())["replicas"]] == ["decode", "prefill"]
        assert sim.replicas[1].role == "prefill"
