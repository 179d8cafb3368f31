"""What an open stream holds in the gateway grows by at most a packed double per token: its
inter-token gaps, kept until it ends (``Relay._stream``), never a Python object per token."""

from __future__ import annotations

import asyncio
import tracemalloc

import aiohttp
import orjson
import pytest

from bench.streams.backend import ITL_HEADER, PacedBackend
from kvgate.gateway.edge.server import running_gateway
from kvgate.gateway.request_path import relay as relay_module
from kvgate.sim.ports import free_ports
from tests.compiled import compiled
from tests.integration.conftest import MODEL, assert_idle, gateway_config

TOKENS = 3000
READ_BEFORE_LOOKING = 1500
ITL_MS = 1.0


def relay_bytes(snapshot: tracemalloc.Snapshot) -> int:
    """Bytes still held that kvgate/gateway/request_path/relay.py allocated."""
    relay = snapshot.filter_traces([tracemalloc.Filter(True, "*/gateway/request_path/relay.py")])
    return sum(stat.size for stat in relay.statistics("filename"))


@pytest.mark.skipif(compiled(relay_module), reason="tracemalloc needs a Python frame; compiled code has none")
async def test_a_long_stream_holds_eight_bytes_a_token_for_its_gaps() -> None:
    port = free_ports(1)
    loop = asyncio.get_running_loop()
    backend = await loop.create_server(PacedBackend, "127.0.0.1", port)
    config = gateway_config([f"http://127.0.0.1:{port}"], health={"interval_s": 60.0})
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": TOKENS,
        "stream": True,
    }
    headers = {"content-type": "application/json", ITL_HEADER.decode(): str(ITL_MS)}
    tracemalloc.start()
    try:
        async with running_gateway(config) as gw, aiohttp.ClientSession() as session:
            async with session.post(
                gw.url + "/v1/chat/completions", data=orjson.dumps(body), headers=headers
            ) as r:
                assert r.status == 200
                tokens = 0
                before_bytes = relay_bytes(tracemalloc.take_snapshot())
                async for line in r.content:
                    tokens += line.startswith(b"data: {")
                    if tokens == READ_BEFORE_LOOKING:
                        held_bytes = relay_bytes(tracemalloc.take_snapshot()) - before_bytes
                        break
            await assert_idle(gw)
    finally:
        tracemalloc.stop()
        backend.close()
    assert held_bytes < 12 * READ_BEFORE_LOOKING, f"{held_bytes / READ_BEFORE_LOOKING:.1f} bytes a token"
