"""Admission through the real gateway in front of the simulator: 429 with Retry-After under overload,
clients that honour it get through, no preemption behind kvgate, queued clients that leave are
dropped at once, 401 and 400 before any replica sees the request."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import openai
import orjson

from kvgate.admission.tokenizer import TiktokenTokenizer
from kvgate.gateway.edge.server import RunningGateway, running_gateway
from kvgate.gateway.request_path.prompt import OFF_LOOP_TEXT_BYTES
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config

KV_CAPACITY_TOKENS = 4000
MAX_SEQS = 16
PROMPT = "Summarise the following words: " + " ".join(f"item{i}" for i in range(24))
JSON = {"content-type": "application/json"}
PROMPT_TOKENS = TiktokenTokenizer.from_name().count(PROMPT)
"""The gateway and the simulator count the prompt with the same default encoding."""
MAX_TOKENS = 500


def small_fleet(time_scale: float = 0.0, replicas: int = 1) -> SimFleet:
    return SimFleet(
        replicas=replicas,
        time_scale=time_scale,
        seed=0,
        overrides={"warmup_s": 0, "kv_capacity_tokens": KV_CAPACITY_TOKENS, "max_num_seqs": MAX_SEQS},
    )


def config_for(
    fleet: SimFleet, max_model_len: int = 131072, auth: dict[str, Any] | None = None, **admission: Any
) -> Any:
    pool = {"name": "default", "replicas": fleet.urls, "kv_capacity_tokens": KV_CAPACITY_TOKENS}
    model = {"name": MODEL, "max_model_len": max_model_len, "kv_bytes_per_token": 131072}
    pools = [{**pool, "max_sequences": MAX_SEQS}]
    return gateway_config(fleet.urls, models=[model], pools=pools, admission=admission, auth=auth or {})


def completion(max_tokens: int = MAX_TOKENS, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, **extra}


def preemptions(fleet: SimFleet) -> int:
    return sum(r.engine.stats.num_preemptions for r in fleet.replicas)


async def test_overload_is_429_with_both_retry_headers_and_a_reason() -> None:
    async with small_fleet() as fleet, running_gateway(config_for(fleet, max_queue_wait_s=0)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            answers = await asyncio.gather(
                *(http.post("/v1/completions", json=completion()) for _ in range(24))
            )
        rejected = [a for a in answers if a.status_code == 429]
        assert rejected, "24 requests of ~560 KV tokens cannot all fit 4000 tokens"
        assert any(a.status_code == 200 for a in answers)
        for answer in rejected:
            assert int(answer.headers["retry-after"]) >= 1
            assert int(answer.headers["retry-after-ms"]) >= 1
            assert int(answer.headers["retry-after-ms"]) <= int(answer.headers["retry-after"]) * 1000
            error = answer.json()["error"]
            assert error["type"] == "RateLimitError"
            assert error["reason"] == "kv_capacity"
            assert error["message"]
        await assert_idle(gw)


async def test_the_openai_sdk_honouring_retry_after_gets_through() -> None:
    async with (
        small_fleet() as fleet,
        running_gateway(config_for(fleet, max_queue_wait_s=0, default_inter_token_s=0.003)) as gw,
    ):
        client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="unused")
        async with client:
            answers = await asyncio.gather(
                *(
                    client.completions.create(
                        model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, extra_body={"ignore_eos": True}
                    )
                    for _ in range(10)
                )
            )
        assert all(a.usage is not None and a.usage.completion_tokens == MAX_TOKENS for a in answers)
        async with httpx.AsyncClient(base_url=gw.url) as http:
            metrics = (await http.get("/metrics")).text
        assert 'decision="reject"' in metrics, "some requests were turned away first"
        await assert_idle(gw)


async def test_sdk_default_retries_claim_their_promised_slots_and_leave_none_behind() -> None:
    async with (
        small_fleet(time_scale=0.05) as fleet,
        running_gateway(config_for(fleet, max_queue_wait_s=0, default_inter_token_s=0.003)) as gw,
    ):
        client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="unused")
        async with client:
            answers = await asyncio.gather(
                *(
                    client.completions.with_raw_response.create(
                        model=MODEL,
                        prompt=f"{PROMPT} ({i})",
                        max_tokens=MAX_TOKENS,
                        extra_body={"ignore_eos": True},
                    )
                    for i in range(16)
                )
            )
        retries = [int(a.http_request.headers["x-stainless-retry-count"]) for a in answers]
        assert max(retries) >= 1, "16 requests of ~560 KV tokens cannot all fit 4000 tokens at once"
        assert all(a.parse().usage is not None for a in answers)
        controller = gw.gateway.path.dispatcher.controller
        assert controller.queue_stats(time.monotonic()).promised_requests == 0
        await assert_idle(gw)


async def test_no_preemption_behind_kvgate_while_the_same_load_direct_preempts() -> None:
    async with small_fleet() as fleet:
        async with (
            running_gateway(config_for(fleet, max_queue_wait_s=300)) as gw,
            httpx.AsyncClient(base_url=gw.url, timeout=60) as http,
        ):
            answers = await asyncio.gather(
                *(http.post("/v1/completions", json=completion()) for _ in range(16))
            )
            assert all(a.status_code == 200 for a in answers), [
                a.text for a in answers if a.status_code != 200
            ]
            assert preemptions(fleet) == 0
            await assert_idle(gw)
        async with httpx.AsyncClient(base_url=fleet.urls[0], timeout=60) as direct:
            answers = await asyncio.gather(
                *(direct.post("/v1/completions", json=completion()) for _ in range(16))
            )
            assert all(a.status_code == 200 for a in answers)
        assert preemptions(fleet) > 4


async def test_a_queued_client_that_leaves_is_dropped_from_the_queue_at_once() -> None:
    async with (
        small_fleet(time_scale=1.0) as fleet,
        running_gateway(config_for(fleet, max_queue_wait_s=300)) as gw,
    ):
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as http:
            holders = [asyncio.create_task(http.post("/v1/completions", json=completion())) for _ in range(7)]
            assert await eventually(lambda: gw.state.ledger.totals().resident_sequences == 7)
            waiter = asyncio.create_task(http.post("/v1/completions", json=completion()))
            assert await eventually(lambda: gw.state.queued == 1)
            waiter.cancel()
            assert await eventually(lambda: gw.state.queued == 0)
            assert gw.gateway.path.dispatcher.controller.queue_stats(0.0).requests == 0
            # At once: while the holders still run, not when capacity frees and it would dispatch.
            assert gw.state.ledger.totals().resident_sequences == 7, "the holders are still running"
            answers = await asyncio.gather(*holders)
            assert all(a.status_code == 200 for a in answers)
        await assert_idle(gw)


async def _post(gw: RunningGateway, body: dict[str, Any], key: str | None = None) -> httpx.Response:
    headers = {} if key is None else {"authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
        return await http.post("/v1/completions", json=body, headers=headers)


async def test_auth_on_an_unknown_key_is_401_and_a_known_key_is_served() -> None:
    tenants = [{"name": "team", "api_keys": ["sk-team"]}]
    async with (
        small_fleet() as fleet,
        running_gateway(config_for(fleet, auth={"enabled": True, "tenants": tenants})) as gw,
    ):
        for key in (None, "sk-wrong"):
            answer = await _post(gw, completion(8), key)
            assert answer.status_code == 401
            assert answer.json()["error"]["type"] == "AuthenticationError"
        assert (await _post(gw, completion(8), "sk-team")).status_code == 200
        assert sum(sum(r.engine.stats.request_success.values()) for r in fleet.replicas) == 1
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            for headers in ({}, {"authorization": "Bearer sk-wrong"}, {"authorization": "sk-team"}):
                listed = await http.get("/v1/models", headers=headers)
                assert listed.status_code == 401, headers
                assert listed.json()["error"]["type"] == "AuthenticationError"
            listed = await http.get("/v1/models", headers={"authorization": "Bearer sk-team"})
            assert listed.status_code == 200 and listed.json()["data"][0]["id"] == MODEL
        await assert_idle(gw)


async def test_missing_max_tokens_under_reject_and_a_request_longer_than_the_model_are_400() -> None:
    rules = {"default_model": {"max_tokens_policy": "reject"}}
    async with small_fleet() as fleet, running_gateway(config_for(fleet, max_model_len=1000, **rules)) as gw:
        no_cap = await _post(gw, {"model": MODEL, "prompt": "hello"})
        assert no_cap.status_code == 400
        assert no_cap.json()["error"]["param"] == "max_tokens"
        too_long = await _post(gw, completion(1000 - PROMPT_TOKENS + 1))
        assert too_long.status_code == 400
        assert too_long.json()["error"]["param"] == "max_tokens"
        assert "context length" in too_long.json()["error"]["message"]
        assert sum(sum(r.engine.stats.request_success.values()) for r in fleet.replicas) == 0
        await assert_idle(gw)


async def test_the_replica_tokenizer_counts_exactly_and_usage_calibrates_streams_and_bodies() -> None:
    async with small_fleet() as fleet:
        model = {
            "name": MODEL,
            "max_model_len": 131072,
            "kv_bytes_per_token": 131072,
            "tokenizer": {"kind": "replica"},
        }
        pool = {"name": "default", "replicas": fleet.urls, "kv_capacity_tokens": KV_CAPACITY_TOKENS}
        config = gateway_config(fleet.urls, models=[model], pools=[pool])
        async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            chat = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8}
            assert (await http.post("/v1/chat/completions", json=chat)).status_code == 200
            streamed = await http.post("/v1/completions", json=completion(8, stream=True))
            assert streamed.status_code == 200 and b'"usage"' not in streamed.content
            # Token ids are counted as they are, small or past the inline bound: never as text.
            for ids, layout in (([11, 12, 13] * 50, 0), (list(range(10_000, 13_500)), orjson.OPT_INDENT_2)):
                body = orjson.dumps({"model": MODEL, "prompt": ids, "max_tokens": 4}, option=layout)
                assert (len(body) > OFF_LOOP_TEXT_BYTES) is (layout != 0)
                answer = await http.post("/v1/completions", content=body, headers=JSON)
                assert answer.status_code == 200, answer.text
                assert answer.json()["usage"]["prompt_tokens"] == len(ids)
            calibration = gw.gateway.path.dispatcher.controller.calibration.prompt(MODEL)
            assert calibration is not None
            assert calibration.requests == 4
            assert calibration.estimated_tokens_total == calibration.actual_tokens_total
            await assert_idle(gw)


async def test_a_large_prompt_is_counted_off_the_event_loop_and_matches_the_replica() -> None:
    async with (
        SimFleet(replicas=1, time_scale=0.0, seed=0) as fleet,
        running_gateway(gateway_config(fleet.urls)) as gw,
    ):
        prompt = "the gateway counts every token of a long prompt " * 800
        assert len(prompt.encode()) > OFF_LOOP_TEXT_BYTES
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            answer = await http.post(
                "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 4}
            )
        assert answer.status_code == 200
        calibration = gw.gateway.path.dispatcher.controller.calibration.prompt(MODEL)
        assert calibration is not None
        assert (
            calibration.estimated_tokens_total
            == calibration.actual_tokens_total
            == answer.json()["usage"]["prompt_tokens"]
        )
        await assert_idle(gw)


async def test_queued_requests_dispatched_together_are_routed_on_the_loads_left_by_the_ones_before() -> None:
    """One pump cycle lets two queued requests of about 1,500 KV tokens go (the blocker ahead of them
    left). The queue walk counts the first on the replica with the most room (the one running three
    sequences), but least-request routes it to the other, leaving about 500 tokens there; the second,
    which the walk saw fit only there, was routed on the cycle's snapshot, where the first was not
    yet: 4,912 tokens reserved on a replica of 4,000, and it preempted. Routed on the loads of the
    moment, the second waits for the next cycle and goes to the replica with room."""
    async with small_fleet(time_scale=0.5, replicas=2) as fleet:
        config = config_for(fleet, max_queue_wait_s=300, head_of_line_max_wait_s=0)
        routing = config.routing.model_copy(update={"policy": "least_request"})
        async with (
            running_gateway(config.model_copy(update={"routing": routing})) as gw,
            httpx.AsyncClient(base_url=gw.url, timeout=120) as http,
        ):
            await _dispatch_two_queued_together(gw, http, fleet)
        await assert_idle(gw)


async def _dispatch_two_queued_together(gw: RunningGateway, http: httpx.AsyncClient, fleet: SimFleet) -> None:
    prompt_tokens = PROMPT_TOKENS
    three = completion((1200 - prompt_tokens) // 3, n=3, stream=True)
    holder = completion(2000 - prompt_tokens, stream=True)
    blocker = completion(3000 - prompt_tokens)
    queued = completion(1500 - prompt_tokens)
    ledger = gw.state.ledger

    def reserved() -> list[int]:
        return [ledger.load(r).reserved_kv_tokens for r in gw.state.replicas]

    running = [asyncio.create_task(http.post("/v1/completions", json=three))]
    assert await eventually(lambda: ledger.totals().resident_sequences == 3)
    running.append(asyncio.create_task(http.post("/v1/completions", json=holder)))
    assert await eventually(lambda: ledger.totals().resident_sequences == 4)
    assert sorted(reserved()) == [1200, 2000]
    waiting = asyncio.create_task(http.post("/v1/completions", json=blocker))
    assert await eventually(lambda: gw.state.queued == 1)
    running += [asyncio.create_task(http.post("/v1/completions", json=queued)) for _ in range(2)]
    assert await eventually(lambda: gw.state.queued == 3)
    waiting.cancel()
    assert await eventually(lambda: ledger.totals().resident_sequences == 6)
    assert max(reserved()) <= KV_CAPACITY_TOKENS, reserved()
    answers = await asyncio.gather(*running)
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    assert preemptions(fleet) == 0
