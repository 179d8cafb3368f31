"""A replica whose SSE events are cut across writes: the gateway still finds and strips the
usage-only event, relays every other byte unchanged, and hears every inter-token gap; a replica
framing events with CRLF gets each event relayed as soon as it is whole, and a stream's TTFT is
recorded while it is still streaming."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import aiohttp
import orjson
import pytest
from aiohttp import web

from kvgate.gateway.edge.server import running_gateway
from tests.integration.conftest import MODEL, assert_idle, gateway_config

TOKENS = 5
GAP_S = 0.02


def _event(payload: Mapping[str, object]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


TOKEN = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "x"}}]}
TOKEN_EVENTS = [_event(TOKEN) for _ in range(TOKENS)]
USAGE_EVENT = _event(
    {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {"prompt_tokens": 7, "completion_tokens": TOKENS, "total_tokens": 7 + TOKENS},
    }
)
DONE_EVENT = b"data: [DONE]\n\n"


async def _chat(request: web.Request) -> web.StreamResponse:
    await request.read()
    response = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await response.prepare(request)
    for event in TOKEN_EVENTS:
        await response.write(event)
        await asyncio.sleep(GAP_S)
    half = len(USAGE_EVENT) // 2
    for part in (USAGE_EVENT[:half], USAGE_EVENT[half:] + DONE_EVENT):
        await response.write(part)
        await asyncio.sleep(GAP_S)
    await response.write_eof()
    return response


async def _health(_: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _serve(chat: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", _health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


@pytest.fixture
async def splitting_replica() -> AsyncIterator[str]:
    async for url in _serve(_chat):
        yield url


async def test_usage_event_split_across_writes_is_stripped_and_gaps_counted(splitting_replica: str) -> None:
    config = gateway_config([splitting_replica])
    async with running_gateway(config) as gw, aiohttp.ClientSession() as client:
        messages = [{"role": "user", "content": "hi"}]
        body = {"model": MODEL, "max_tokens": 16, "stream": True, "messages": messages}
        async with client.post(gw.url + "/v1/chat/completions", json=body) as response:
            assert response.status == 200
            received = await response.read()
        assert received == b"".join(TOKEN_EVENTS) + DONE_EVENT
        await assert_idle(gw)
        exposition = gw.gateway.metrics.render().decode()
        prompt_line = next(x for x in exposition.splitlines() if x.startswith("kvgate_prompt_tokens_total{"))
        assert prompt_line.endswith(" 7.0"), prompt_line
        count_line = next(
            x for x in exposition.splitlines() if x.startswith("kvgate_inter_token_latency_seconds_count{")
        )
        assert count_line.endswith(f" {float(TOKENS - 1)}"), count_line
        p95 = gw.gateway.metrics.signals_doc()["pools"]["default"]["itl_p95_s"]
        assert p95 is not None and p95 >= GAP_S


async def test_crlf_framed_events_are_relayed_whole_and_ttft_is_recorded_mid_stream() -> None:
    seen_first = asyncio.Event()
    first, rest = b'data: {"n": 1}\r\n\r\n', b'data: {"n": 2}\r\n\r\ndata: [DONE]\r\n\r\n'

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(first)
        await asyncio.wait_for(seen_first.wait(), timeout=10.0)
        await response.write(rest)
        await response.write_eof()
        return response

    async for url in _serve(chat):
        config = gateway_config([url])
        async with running_gateway(config) as gw, aiohttp.ClientSession() as client:
            messages = [{"role": "user", "content": "hi"}]
            body = {"model": MODEL, "max_tokens": 4, "stream": True, "messages": messages}
            async with client.post(gw.url + "/v1/chat/completions", json=body) as response:
                received = await response.content.readany()
                exposition = gw.gateway.metrics.render().decode()
                seen_first.set()
                received += await response.read()
            assert received == first + rest
            await assert_idle(gw)
        ttft_count = next(
            x for x in exposition.splitlines() if x.startswith("kvgate_time_to_first_token_seconds_count{")
        )
        assert ttft_count.endswith(" 1.0"), "a stream's TTFT is recorded at its first token"
