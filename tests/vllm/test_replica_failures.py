"""A real vLLM replica lost or drained under a stream that ``kvgate serve`` is relaying.

Killed (SIGKILL to its API server, engine and worker at once), the client's stream still ends as
an SSE stream should, an error event then ``[DONE]``, and the gateway holds nothing for it after.
Sent SIGTERM with ``--shutdown-timeout``, vLLM drains: the stream in flight runs to its last token
while the replica refuses new work (``/health`` still answers 200, a new request gets a 500), then
the process exits. Each test starts a replica of its own for that (the session's shared one stays).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.integration.processes import assert_process_idle, serving_process
from tests.vllm.conftest import SpareReplica, gateway_config
from tests.vllm.servers import SERVED_MODEL, VllmServer

pytestmark = pytest.mark.vllm

STREAM_TOKENS = 1500
"""Seconds of decoding on two cores: long enough to be interrupted, short enough to drain."""


def long_stream() -> dict[str, Any]:
    return {
        "model": SERVED_MODEL,
        "prompt": "Tell a long story about a gateway.",
        "max_tokens": STREAM_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


class SseReader:
    """The events of one SSE response, read as they come."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self._buffer = b""
        self.events: list[bytes] = []

    async def until(self, count: int) -> None:
        """Read until at least ``count`` events arrived (or the stream ended)."""
        while len(self.events) < count and await self._read():
            pass

    async def to_end(self) -> None:
        while await self._read():
            pass

    async def _read(self) -> bool:
        chunk = await self._response.content.readany()
        if not chunk:
            return False
        self._buffer += chunk
        *complete, self._buffer = self._buffer.split(b"\n\n")
        self.events.extend(event.removeprefix(b"data: ") for event in complete if event)
        return True


async def test_a_replica_killed_mid_stream_ends_the_stream_cleanly(
    spare_replica: SpareReplica, tmp_path: Path
) -> None:
    with spare_replica() as doomed:
        async with serving_process(tmp_path, gateway_config([doomed.url])) as (url, _process):
            async with (
                aiohttp.ClientSession() as http,
                http.post(url + "/v1/completions", json=long_stream()) as r,
            ):
                assert r.status == 200
                reader = SseReader(r)
                await reader.until(20)
                doomed.kill()
                await asyncio.wait_for(reader.to_end(), 60)
            error = orjson.loads(reader.events[-2])["error"]
            assert reader.events[-1] == b"[DONE]" and set(error) == {"message", "type", "param", "code"}
            assert 20 <= len(reader.events) - 2 < STREAM_TOKENS
            await assert_process_idle(url)


async def test_sigterm_drains_the_stream_in_flight_then_the_replica_exits(
    spare_replica: SpareReplica, tmp_path: Path
) -> None:
    with spare_replica("--shutdown-timeout", "120") as draining:
        async with (
            serving_process(tmp_path, gateway_config([draining.url])) as (url, _process),
            aiohttp.ClientSession() as http,
        ):
            async with http.post(url + "/v1/completions", json=long_stream()) as r:
                assert r.status == 200
                reader = SseReader(r)
                await reader.until(20)
                draining.terminate()
                await refused_while_draining(http, draining, url)
                await asyncio.wait_for(reader.to_end(), 300)
            assert reader.events[-1] == b"[DONE]"
            usage = orjson.loads(reader.events[-2])["usage"]
            assert usage["completion_tokens"] == STREAM_TOKENS, "every token of the stream in flight"
            finishes = [orjson.loads(e)["choices"][0]["finish_reason"] for e in reader.events[:-2]]
            assert finishes[-1] == "length" and "abort" not in finishes
            await assert_process_idle(url)
        assert await asyncio.to_thread(draining.process.wait, 120) == 0


async def refused_while_draining(http: aiohttp.ClientSession, replica: VllmServer, gateway_url: str) -> None:
    """During vLLM's drain its health check still passes but new work is refused; through the
    gateway (no other replica to retry on) that is an OpenAI-shaped 5xx, not a hang."""
    async with http.get(replica.url + "/health") as health:
        assert health.status == 200
    body = {"model": SERVED_MODEL, "prompt": "hi", "max_tokens": 2}
    async with http.post(replica.url + "/v1/completions", json=body) as direct:
        assert direct.status == 500
    async with http.post(gateway_url + "/v1/completions", json=body) as relayed:
        assert relayed.status in (502, 503)
        assert {"message", "type", "param", "code"} <= set((await relayed.json())["error"])
