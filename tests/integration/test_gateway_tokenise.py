"""Tokenising huge prompts cannot be abused: the work is bounded, stops when its client leaves, and
stops once the prompt is known to be over the model's context.

Each test sends multi-megabyte prompts through the real gateway in front of the simulator and reads
the encoder's own counters (tokens counted off the event loop, jobs running and waiting), so the
assertions are about work done, never about time.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx
import pytest

from kvgate.gateway.edge.server import RunningGateway, running_gateway
from kvgate.gateway.request_path.prompt import PromptEncoder
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config

UNIT = " the gateway counts every token"
"""Five pieces of one token each, so ``UNIT * k`` is exactly ``5 * k`` tokens."""
EIGHT_MB_UNITS = 8 * 1024 * 1024 // len(UNIT)
LONG_WORD = " antidisestablishmentarianism"
"""One piece of six tokens: a text of them is counted, as its lower bound is a sixth of its count."""
LONG_WORDS = 100_000
"""2.9 MB of ``LONG_WORD``: 600k tokens whose lower bound (100k) does not reach a 128k window."""
WINDOW_TOKENS = 131072
HUGE_WINDOW_TOKENS = 1 << 26
BIG_BODIES = {"max_body_bytes": 40 * 1024 * 1024}


def _config(fleet: SimFleet, max_model_len: int, **model: Any) -> Any:
    models = [{"name": MODEL, "max_model_len": max_model_len, "kv_bytes_per_token": 131072, **model}]
    return gateway_config(fleet.urls, server=BIG_BODIES, models=models)


def _encoder(gw: RunningGateway) -> PromptEncoder:
    return gw.gateway.path.pricer.encoder


def _completion(prompt: str) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 4}


async def test_an_over_context_prompt_is_refused_after_counting_about_the_context() -> None:
    async with (
        SimFleet(replicas=1, time_scale=0.0, seed=0) as fleet,
        running_gateway(_config(fleet, WINDOW_TOKENS)) as gw,
        httpx.AsyncClient(base_url=gw.url, timeout=120) as http,
    ):
        long_words = await http.post("/v1/completions", json=_completion(LONG_WORD * LONG_WORDS))
        assert long_words.status_code == 400
        assert f"maximum context length is {WINDOW_TOKENS} tokens" in long_words.json()["error"]["message"]
        counted = _encoder(gw).tokens_counted
        assert WINDOW_TOKENS <= counted < 2 * WINDOW_TOKENS < 6 * LONG_WORDS
        for prompt in (UNIT * EIGHT_MB_UNITS, "x" * (8 * 1024 * 1024)):
            refused = await http.post("/v1/completions", json=_completion(prompt))
            assert refused.status_code == 400
            assert f"maximum context length is {WINDOW_TOKENS} tokens" in refused.json()["error"]["message"]
            assert _encoder(gw).tokens_counted == counted, "no BPE work for a prompt that provably cannot fit"
        await assert_idle(gw)


async def test_a_client_that_leaves_stops_its_tokenisation() -> None:
    async with (
        SimFleet(replicas=1, time_scale=0.0, seed=0) as fleet,
        running_gateway(_config(fleet, HUGE_WINDOW_TOKENS)) as gw,
    ):
        encoder = _encoder(gw)
        async with httpx.AsyncClient(base_url=gw.url, timeout=0.3) as http:
            with pytest.raises(httpx.TimeoutException):
                await http.post("/v1/completions", json=_completion(UNIT * EIGHT_MB_UNITS))
        assert await eventually(lambda: encoder.running == 0, timeout_s=60)
        assert encoder.tokens_counted < 5 * EIGHT_MB_UNITS
        await assert_idle(gw)


async def test_concurrent_huge_prompts_are_tokenised_at_most_the_bound_at_once() -> None:
    async with (
        SimFleet(replicas=1, time_scale=0.0, seed=0) as fleet,
        running_gateway(_config(fleet, WINDOW_TOKENS, tokenize_concurrency=2)) as gw,
        httpx.AsyncClient(base_url=gw.url, timeout=120) as http,
    ):
        encoder = _encoder(gw)
        seen: list[int] = []

        async def watch() -> None:
            while True:
                seen.append(encoder.running)
                await asyncio.sleep(0.001)

        watcher = asyncio.create_task(watch())
        prompt = LONG_WORD * LONG_WORDS
        answers = await asyncio.gather(
            *(http.post("/v1/completions", json=_completion(prompt)) for _ in range(6))
        )
        watcher.cancel()
        assert [a.status_code for a in answers] == [400] * 6
        assert 1 <= max(seen) <= 2
        assert encoder.running == encoder.waiting == 0
        await assert_idle(gw)


async def test_a_client_that_leaves_while_waiting_for_a_turn_stops_waiting_at_once() -> None:
    async with (
        SimFleet(replicas=1, time_scale=0.0, seed=0) as fleet,
        running_gateway(_config(fleet, HUGE_WINDOW_TOKENS, tokenize_concurrency=1)) as gw,
        httpx.AsyncClient(base_url=gw.url, timeout=120) as http,
    ):
        encoder = _encoder(gw)
        first = asyncio.create_task(http.post("/v1/completions", json=_completion(UNIT * 2 * EIGHT_MB_UNITS)))
        assert await eventually(lambda: encoder.running == 1)
        second = asyncio.create_task(http.post("/v1/completions", json=_completion(UNIT * 10_000)))
        assert await eventually(lambda: encoder.waiting == 1)
        second.cancel()
        assert await eventually(lambda: encoder.waiting == 0)
        assert encoder.running == 1, "the first prompt is still being counted: the second left its turn"
        first.cancel()
        assert await eventually(lambda: encoder.running == 0, timeout_s=60)
        assert encoder.tokens_counted < 5 * 2 * EIGHT_MB_UNITS
        for left in (first, second):
            with contextlib.suppress(asyncio.CancelledError):
                await left
        await assert_idle(gw)
