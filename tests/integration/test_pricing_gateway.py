"""The gateway prices what the replica will really run, through the real gateway in front of the
simulator: the cap it priced is the cap the replica honours (written into the forwarded body when
the client sent none or two that disagree), ``n`` is priced as that many sequences and bounded, and
each prompt of a completions batch is its own request. A paused replica holds an admitted request
at the gateway, so the reservation can be read while it is in flight without any timing."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from kvgate.admission.tokenizer import ChatTemplate, TiktokenTokenizer
from kvgate.gateway.edge.server import RunningGateway, running_gateway
from kvgate.sim.fleet import SimFleet
from kvgate.vocabulary.replica import ReplicaLoad
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config

MAX_MODEL_LEN = 2000
DEFAULT_CAP = 50
TOKENIZER = TiktokenTokenizer.from_name()
PROMPTS = ["The first prompt of the batch", "A second, longer prompt of the same batch of prompts", "Third"]


def tokens(text: str) -> int:
    return TOKENIZER.count(text)


def in_blocks(kv_tokens: int) -> int:
    """What the ledger reserves for ``kv_tokens``: whole 16-token KV blocks, as vLLM allocates them."""
    return -(-kv_tokens // 16) * 16


def fleet_of(max_model_len: int = MAX_MODEL_LEN) -> SimFleet:
    return SimFleet(
        replicas=1, time_scale=0.0, seed=0, overrides={"warmup_s": 0, "max_model_len": max_model_len}
    )


def config_for(fleet: SimFleet, max_model_len: int = MAX_MODEL_LEN, **admission: Any) -> Any:
    model = {"name": MODEL, "max_model_len": max_model_len, "kv_bytes_per_token": 131072}
    rules = {"default_model": {"default_max_tokens": DEFAULT_CAP}}
    return gateway_config(fleet.urls, models=[model], admission={**rules, **admission})


async def held_while_paused(
    gw: RunningGateway, fleet: SimFleet, http: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> tuple[ReplicaLoad, httpx.Response]:
    """The gateway's reservation for ``body`` while the replica holds it, then the answer."""
    replica = fleet.replicas[0]
    replica.pause()
    answer = asyncio.create_task(http.post(path, json=body))
    assert await eventually(lambda: gw.state.ledger.totals().resident_sequences > 0 or answer.done())
    held = gw.state.ledger.totals()
    replica.resume()
    return held, await answer


async def test_no_max_tokens_generates_at_most_the_cap_priced_on_both_routes() -> None:
    async with fleet_of() as fleet, running_gateway(config_for(fleet)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as http:
            chat = await http.post(
                "/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "ignore_eos": True},
            )
            completion = await http.post(
                "/v1/completions", json={"model": MODEL, "prompt": "hi", "ignore_eos": True}
            )
            stream = await http.post(
                "/v1/chat/completions",
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "hi"}],
                    "ignore_eos": True,
                    "stream": True,
                },
            )
        assert chat.status_code == completion.status_code == stream.status_code == 200
        assert chat.json()["usage"]["completion_tokens"] == DEFAULT_CAP, "not max_model_len - prompt"
        assert completion.json()["usage"]["completion_tokens"] == DEFAULT_CAP, "not vLLM's default of 16"
        events = [
            line for line in stream.text.split("\n\n") if '"content":"' in line and '"content":""' not in line
        ]
        assert len(events) == DEFAULT_CAP
        await assert_idle(gw)


async def test_n_is_priced_as_that_many_sequences_and_bounded() -> None:
    async with fleet_of() as fleet, running_gateway(config_for(fleet)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as http:
            for n in (200, 1_000_000_000):
                too_many = await http.post(
                    "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 5, "n": n}
                )
                assert too_many.status_code == 400
                error = too_many.json()["error"]
                assert (error["type"], error["param"]) == ("BadRequestError", "n")
                assert "at most 128" in error["message"]
            assert fleet.replicas[0].engine.stats.num_steps == 0, "no replica saw them"
            body = {"model": MODEL, "prompt": "hi", "max_tokens": 7, "n": 4, "ignore_eos": True}
            held, answer = await held_while_paused(gw, fleet, http, "/v1/completions", body)
        assert held.resident_sequences == 4
        assert held.reserved_kv_tokens == in_blocks(tokens("hi") + 4 * 7)
        assert answer.status_code == 200
        assert len(answer.json()["choices"]) == 4 and answer.json()["usage"]["completion_tokens"] == 28
        await assert_idle(gw)


async def test_more_sequences_than_a_replica_may_run_is_a_400_not_a_wait() -> None:
    async with (
        fleet_of() as fleet,
        running_gateway(config_for(fleet, max_active_sequences_per_replica=8)) as gw,
    ):
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as http:
            answer = await http.post(
                "/v1/chat/completions",
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 5,
                    "n": 9,
                },
            )
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert error["param"] == "n" and "9 sequences" in error["message"] and "at most 8" in error["message"]
        await assert_idle(gw)


async def test_completions_price_and_forward_max_tokens_whatever_max_completion_tokens_says() -> None:
    async with fleet_of() as fleet, running_gateway(config_for(fleet)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as http:
            body = {
                "model": MODEL,
                "prompt": "hi",
                "max_completion_tokens": 1,
                "max_tokens": 40,
                "ignore_eos": True,
            }
            held, answer = await held_while_paused(gw, fleet, http, "/v1/completions", body)
            assert held.reserved_kv_tokens == in_blocks(tokens("hi") + 40)
            assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 40
            chat_body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                "max_completion_tokens": 5,
                "max_tokens": 40,
                "ignore_eos": True,
            }
            held, answer = await held_while_paused(gw, fleet, http, "/v1/chat/completions", chat_body)
            prompt = tokens(ChatTemplate().render(chat_body["messages"]))
            assert held.reserved_kv_tokens == in_blocks(prompt + 5)
            assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 5
        await assert_idle(gw)


async def test_each_prompt_of_a_batch_is_priced_as_its_own_request() -> None:
    async with fleet_of() as fleet, running_gateway(config_for(fleet)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as http:
            body = {"model": MODEL, "prompt": PROMPTS, "max_tokens": 6, "n": 2, "ignore_eos": True}
            held, answer = await held_while_paused(gw, fleet, http, "/v1/completions", body)
            assert held.resident_sequences == 6
            assert held.reserved_kv_tokens == in_blocks(sum(tokens(p) for p in PROMPTS) + 6 * 6)
            assert answer.status_code == 200
            usage = answer.json()["usage"]
            assert usage["completion_tokens"] == 36
            assert usage["prompt_tokens"] == sum(tokens(p) for p in PROMPTS)
            assert sorted(c["index"] for c in answer.json()["choices"]) == list(range(6))
            ids = {"model": MODEL, "prompt": [[1, 2, 3], [4, 5]], "max_tokens": 3, "ignore_eos": True}
            held, answer = await held_while_paused(gw, fleet, http, "/v1/completions", ids)
            assert (held.resident_sequences, held.reserved_kv_tokens) == (2, in_blocks(5 + 2 * 3))
            assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 6
        await assert_idle(gw)


async def test_a_batch_whose_prompts_each_fit_the_window_is_served() -> None:
    """Each prompt + max_tokens must fit the context window, not the batch joined into one."""
    long_prompt = " ".join(f"word{i}" for i in range(300))
    assert 500 < tokens(long_prompt) < 700
    async with fleet_of(1000) as fleet, running_gateway(config_for(fleet, 1000)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as http:
            body = {"model": MODEL, "prompt": [long_prompt, long_prompt], "max_tokens": 200}
            answer = await http.post("/v1/completions", json=body)
            assert answer.status_code == 200, answer.text
            too_long = await http.post(
                "/v1/completions", json={**body, "prompt": ["hi", long_prompt], "max_tokens": 600}
            )
            assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "max_tokens"
        await assert_idle(gw)


async def test_beam_search_is_refused_before_any_replica_sees_it() -> None:
    async with fleet_of() as fleet, running_gateway(config_for(fleet)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as http:
            answer = await http.post(
                "/v1/completions",
                json={"model": MODEL, "prompt": "hi", "max_tokens": 5, "n": 2, "use_beam_search": True},
            )
        assert answer.status_code == 400
        assert answer.json()["error"]["param"] == "use_beam_search"
        await assert_idle(gw)


async def test_the_simulator_runs_each_prompt_of_a_batch_with_n_sequences_as_vllm_does() -> None:
    async with fleet_of() as fleet, httpx.AsyncClient(base_url=fleet.urls[0], timeout=60) as http:
        body = {"prompt": PROMPTS[:2], "max_tokens": 3, "n": 2, "ignore_eos": True, "stream": True}
        stream = await http.post("/v1/completions", json={**body, "stream_options": {"include_usage": True}})
        whole = await http.post("/v1/completions", json={**body, "stream": False})
    assert stream.status_code == whole.status_code == 200
    assert [c["index"] for c in whole.json()["choices"]] == [0, 1, 2, 3]
    assert whole.json()["usage"]["completion_tokens"] == 12
    assert whole.json()["usage"]["prompt_tokens"] == tokens(PROMPTS[0]) + tokens(PROMPTS[1])
    indexes = [line for line in stream.text.split("\n\n") if '"index":3' in line]
    assert len(indexes) == 3
