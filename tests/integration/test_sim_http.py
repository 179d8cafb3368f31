"""Simulated replicas on loopback sockets: the OpenAI SDK, vLLM's endpoints and the fault modes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import openai
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvgate.sim.fleet import DEFAULT_MODEL, SimFleet

MODEL = DEFAULT_MODEL
SMALL = {"kv_capacity_tokens": 20_000, "max_num_seqs": 8, "warmup_s": 0}


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    async with SimFleet(replicas=1, time_scale=0.0, record_streams=True, overrides=SMALL) as sim:
        yield sim


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def _refused(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    try:
        _reader, writer = await asyncio.open_connection(host, int(port))
    except ConnectionRefusedError:
        return True
    writer.close()
    return False


def _metric(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise KeyError(name)


async def test_openai_sdk_chat_and_completions(fleet: SimFleet) -> None:
    client = openai.AsyncOpenAI(base_url=fleet.urls[0] + "/v1", api_key="x")
    messages: list[openai.types.chat.ChatCompletionMessageParam] = [
        {"role": "user", "content": "Hello there"}
    ]
    chat = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=7)
    assert chat.choices[0].finish_reason == "length" and chat.choices[0].message.role == "assistant"
    assert chat.usage is not None and chat.usage.completion_tokens == 7 and chat.usage.prompt_tokens > 0
    stream = await client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=5, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert (
        chunks[-1].usage.completion_tokens == 5 and chunks[-1].usage.prompt_tokens == chat.usage.prompt_tokens
    )
    completion = await client.completions.create(model=MODEL, prompt="Once upon a time")
    assert completion.usage is not None and completion.usage.completion_tokens <= 16
    assert completion.choices[0].text
    text_stream = await client.completions.create(
        model=MODEL, prompt="Once", max_tokens=3, stream=True, stream_options={"include_usage": True}
    )
    text_chunks = [chunk async for chunk in text_stream]
    assert text_chunks[-1].usage is not None and text_chunks[-1].usage.completion_tokens == 3
    with pytest.raises(openai.NotFoundError):
        await client.completions.create(model="no-such-model", prompt="x")
    await client.close()


async def test_tokenize_counts_exactly_what_generation_bills(
    fleet: SimFleet, http: aiohttp.ClientSession
) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Why is the sky blue?"},
    ]
    async with http.post(fleet.urls[0] + "/tokenize", json={"model": MODEL, "messages": messages}) as r:
        tokenized = await r.json()
    async with http.post(
        fleet.urls[0] + "/v1/chat/completions", json={"messages": messages, "max_tokens": 1}
    ) as r:
        answer = await r.json()
    assert tokenized["count"] == len(tokenized["tokens"]) == answer["usage"]["prompt_tokens"]
    assert tokenized["max_model_len"] == 20_000


async def test_models_health_version_and_unknown_paths(fleet: SimFleet, http: aiohttp.ClientSession) -> None:
    url = fleet.urls[0]
    async with http.get(url + "/v1/models") as r:
        card = (await r.json())["data"][0]
    assert (card["id"], card["object"], card["owned_by"], card["max_model_len"]) == (
        MODEL,
        "model",
        "vllm",
        20_000,
    )
    async with http.get(url + "/health") as r:
        assert r.status == 200
    async with http.get(url + "/version") as r:
        assert "version" in await r.json()
    async with http.get(url + "/v2/nothing") as r:
        assert r.status == 404
    async with http.get(url + "/v1/completions") as r:
        assert (r.status, r.headers["allow"]) == (405, "POST")


@pytest.mark.parametrize(
    ("body", "content_type", "status"),
    [
        (b"{oops", "application/json", 400),
        (b'{"prompt": "x", "max_tokens": 30000}', "application/json", 400),
        (b'{"prompt": "x", "stream_options": {"include_usage": true}}', "application/json", 400),
        (b'{"prompt": "x", "model": "gpt-4"}', "application/json", 404),
        (b'{"prompt": 12}', "application/json", 400),
        (b'{"prompt": "x"}', "text/plain", 400),
    ],
)
async def test_bad_input_gets_a_vllm_error_body(
    fleet: SimFleet, http: aiohttp.ClientSession, body: bytes, content_type: str, status: int
) -> None:
    headers = {"content-type": content_type}
    async with http.post(fleet.urls[0] + "/v1/completions", data=body, headers=headers) as r:
        assert r.status == status
        error = orjson.loads(await r.read())["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status


async def test_output_past_the_context_window_is_cut_not_refused(
    fleet: SimFleet, http: aiohttp.ClientSession
) -> None:
    """As vLLM: prompt + max_tokens past max_model_len runs, and stops with the window full."""
    prompt = list(range(100, 19_990))
    body = {"prompt": prompt, "max_tokens": 500, "ignore_eos": True}
    async with http.post(fleet.urls[0] + "/v1/completions", json=body) as r:
        assert r.status == 200
        answer = await r.json()
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["total_tokens"] == 20_000


async def test_request_id_n_and_recorded_stream(fleet: SimFleet, http: aiohttp.ClientSession) -> None:
    body = {"prompt": "hi", "max_tokens": 4, "n": 2, "stream": True, "ignore_eos": True}
    async with http.post(fleet.urls[0] + "/v1/completions", json=body, headers={"X-Request-Id": "abc"}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = await r.read()
    events = [line.removeprefix(b"data: ") for line in raw.split(b"\n\n") if line]
    assert events[-1] == b"[DONE]"
    parsed = [orjson.loads(e) for e in events[:-1]]
    assert {p["id"] for p in parsed} == {"cmpl-abc"}
    assert sorted(p["choices"][0]["index"] for p in parsed) == [0] * 4 + [1] * 4
    assert fleet.replicas[0].recorded("abc") == raw == fleet.replicas[0].recorded("cmpl-abc")


async def test_shared_prefix_raises_hits_and_lowers_ttft(
    fleet: SimFleet, http: aiohttp.ClientSession
) -> None:
    url = fleet.urls[0]
    shared = "The quick brown fox jumps over the lazy dog. " * 300
    replica = fleet.replicas[0]

    async def ttft_s(prompt: str) -> float:
        before = replica.engine.stats.ttft_s.sum
        async with http.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1}) as r:
            assert r.status == 200
        return replica.engine.stats.ttft_s.sum - before

    cold = await ttft_s(shared + "first question")
    async with http.get(url + "/metrics") as r:
        hits_before = _metric(await r.text(), "vllm:prefix_cache_hits_total")
    warm = await ttft_s(shared + "second question")
    async with http.get(url + "/metrics") as r:
        hits_after = _metric(await r.text(), "vllm:prefix_cache_hits_total")
    assert hits_after - hits_before > 2000
    assert warm < cold / 3


async def test_prompt_tokens_details_report_the_hit_as_vllm_does(http: aiohttp.ClientSession) -> None:
    """With vLLM's ``--enable-prompt-tokens-details``: whole blocks, never the prompt's last token,
    in the non-streamed usage's three fields and the stream's usage chunk's one; absent without it."""
    shared = "The quick brown fox jumps over the lazy dog. " * 30
    async with SimFleet(replicas=1, time_scale=0.0, overrides=SMALL, prompt_tokens_details=True) as sim:
        url = sim.urls[0] + "/v1/completions"
        body = {"prompt": shared, "max_tokens": 2}
        async with http.post(url, json=body) as r:
            cold = (await r.json())["usage"]
        async with http.post(url, json=body) as r:
            warm = (await r.json())["usage"]
        stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
        async with http.post(url, json=stream) as r:
            events = [line for line in (await r.text()).splitlines() if line.startswith("data: {")]
        streamed = orjson.loads(events[-1][6:])["usage"]
    prompt_tokens = warm["prompt_tokens"]
    hit = (prompt_tokens - 1) // 16 * 16
    details = {"cached_tokens": hit, "created_cache_tokens": None, "multimodal_tokens": None}
    assert cold["prompt_tokens_details"] == {**details, "cached_tokens": 0}
    assert warm["prompt_tokens_details"] == details
    assert streamed["prompt_tokens_details"] == {"cached_tokens": hit}
    async with (
        SimFleet(replicas=1, time_scale=0.0, overrides=SMALL) as plain,
        http.post(plain.urls[0] + "/v1/completions", json=body) as r,
    ):
        assert (await r.json())["usage"]["prompt_tokens_details"] is None


async def test_overcommit_preempts_and_fills_kv() -> None:
    async with (
        SimFleet(
            replicas=1,
            time_scale=0.0,
            overrides={"kv_capacity_tokens": 1024, "max_num_seqs": 8, "warmup_s": 0},
        ) as sim,
        aiohttp.ClientSession() as http,
    ):
        replica = sim.replicas[0]
        peak = 0.0
        body = {"max_tokens": 120, "ignore_eos": True}

        async def one(i: int) -> None:
            async with http.post(
                sim.urls[0] + "/v1/completions", json={**body, "prompt": f"{i} " * 100}
            ) as r:
                assert (await r.json())["usage"]["completion_tokens"] == 120

        task = asyncio.gather(*(one(i) for i in range(8)))
        while not task.done():
            peak = max(peak, replica.engine.kv_cache_usage_ratio)
            await asyncio.sleep(0)
        await task
        async with http.get(sim.urls[0] + "/metrics") as r:
            assert _metric(await r.text(), "vllm:num_preemptions_total") > 0
        assert peak >= 0.95


async def test_port_refuses_during_cold_start_then_serves() -> None:
    async with SimFleet(replicas=0, time_scale=1.0, overrides=SMALL) as sim:
        replica = await sim.add_replica(cold_start_s=0.3)
        assert replica.state == "starting"
        assert await _refused(replica.url)
        await replica.wait_ready()
        async with aiohttp.ClientSession() as http, http.get(replica.url + "/health") as r:
            assert r.status == 200


async def test_kill_resets_streams_and_refuses_the_port(http: aiohttp.ClientSession) -> None:
    async with SimFleet(replicas=2, time_scale=0.05, overrides=SMALL) as sim:
        body = {"prompt": "x", "max_tokens": 5000, "ignore_eos": True, "stream": True}
        async with http.post(sim.urls[0] + "/v1/completions", json=body) as r:
            first = await r.content.readany()
            assert first.startswith(b"data: ")
            await sim.kill(0)
            with pytest.raises(aiohttp.ClientPayloadError):
                await r.read()
        assert await _refused(sim.urls[0])
        assert sim.replicas[0].state == "killed" and sim.live == [sim.replicas[1]]
        async with http.post(sim.urls[1] + "/v1/completions", json={"prompt": "x", "max_tokens": 2}) as r:
            assert r.status == 200


async def test_pause_accepts_but_never_answers_until_resumed(
    fleet: SimFleet, http: aiohttp.ClientSession
) -> None:
    await fleet.pause(0)
    request = asyncio.ensure_future(
        http.post(fleet.urls[0] + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
    )
    assert not await _refused(fleet.urls[0])
    await asyncio.sleep(0.2)
    assert not request.done()
    await fleet.resume(0)
    response = await asyncio.wait_for(request, 5)
    assert response.status == 200 and (await response.json())["usage"]["completion_tokens"] == 2
    response.release()


async def test_drain_finishes_in_flight_then_remove_refuses(http: aiohttp.ClientSession) -> None:
    async with SimFleet(replicas=1, time_scale=0.02, overrides=SMALL) as sim:
        body = {"prompt": "x", "max_tokens": 40, "ignore_eos": True, "stream": True}
        async with http.post(sim.urls[0] + "/v1/completions", json=body) as r:
            await r.content.readany()
            removal = asyncio.ensure_future(sim.remove(0))
            await asyncio.sleep(0.05)
            assert await _refused(sim.urls[0])
            raw = await r.read()
        assert raw.endswith(b"data: [DONE]\n\n")
        await removal
        assert sim.replicas[0].state == "removed"


async def test_control_api_resizes_the_fleet(http: aiohttp.ClientSession) -> None:
    async with SimFleet(replicas=1, time_scale=0.0, overrides=SMALL, control_port=0) as sim:
        control = f"{sim.control_url}/replicas"
        async with http.post(control, json={"cold_start_s": 0}) as r:
            added = await r.json()
        assert r.status == 201 and added["id"] == 1 and added["state"] == "ready"
        async with http.post(f"{control}/1/kill") as r:
            assert (await r.json())["state"] == "killed"
        async with http.delete(f"{control}/0") as r:
            assert (await r.json())["state"] == "removed"
        async with http.get(control) as r:
            states = [(x["id"], x["state"]) for x in (await r.json())["replicas"]]
        assert states == [(0, "removed"), (1, "killed")]
        async with http.post(control, json={"cold_start_s": -1}) as r:
            assert r.status == 400
        async with http.post(f"{control}/9/kill") as r:
            assert r.status == 404
        assert await _refused(sim.urls[0]) and await _refused(sim.urls[1])


async def test_client_disconnect_aborts_the_sequence(http: aiohttp.ClientSession) -> None:
    async with SimFleet(replicas=1, time_scale=0.05, overrides=SMALL) as sim:
        engine = sim.replicas[0].engine
        body = {"prompt": "x", "max_tokens": 5000, "ignore_eos": True, "stream": True}
        response = await http.post(sim.urls[0] + "/v1/completions", json=body)
        await response.content.readany()
        assert engine.num_running == 1
        response.close()
        for _ in range(100):
            if engine.num_running == 0:
                break
            await asyncio.sleep(0.01)
        assert engine.num_running == 0 and engine.stats.request_success["abort"] == 1
        with contextlib.suppress(Exception):
            response.release()


async def test_raw_http_pipelining_and_garbage(fleet: SimFleet) -> None:
    host, port = fleet.urls[0].removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\nGET /version HTTP/1.1\r\nhost: x\r\n\r\n")
    first = await reader.readuntil(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 200") and b"content-length: 0" in first
    second = await reader.readuntil(b"}")
    assert b"HTTP/1.1 200" in second and b'"version"' in second
    writer.write(b"\x00\x01 not http at all\r\n\r\n")
    garbage = await reader.read()
    assert garbage.startswith(b"HTTP/1.1 400") and b"connection: close" in garbage
    writer.close()


@pytest.mark.parametrize("cold_start_s", [0.0, 0.05])
async def test_a_port_in_use_fails_loudly_and_cleans_up(cold_start_s: float) -> None:
    blocker = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    busy = blocker.sockets[0].getsockname()[1]
    try:
        fleet = SimFleet(replicas=1, port=busy, time_scale=1.0, cold_start_s=cold_start_s, overrides=SMALL)
        with pytest.raises(OSError):
            await fleet.start()
        replica = fleet.replicas[0]
        assert isinstance(replica.error, OSError) and replica.state == "removed"
    finally:
        blocker.close()
