"""A replica whose ``/tokenize`` answers with a count and no ids: the prompt is priced by the count,
and prompts that differ never share prefix blocks (the ids once were all zeros, so every such
prompt collided in the prefix index and affinity pinned them all to one replica)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
from aiohttp import web

from kvgate.config.models import Model
from kvgate.gateway.request_path.prompt import PromptEncoder

MODEL = "m"


@asynccontextmanager
async def count_only_replica() -> AsyncIterator[str]:
    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"count": 8 * len(body.get("prompt", ""))})

    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_prompts_counted_without_ids_never_share_prefix_blocks() -> None:
    model = Model.model_validate(
        {"name": MODEL, "max_model_len": 100000, "kv_bytes_per_token": 1, "tokenizer": {"kind": "replica"}}
    )
    encoder = PromptEncoder([model], 16)
    async with count_only_replica() as url, aiohttp.ClientSession() as session:
        routed = {}
        for prompt in ("first prompt", "other prompt", "first prompt"):
            counted = await encoder.encode(MODEL, {"prompt": prompt}, len(prompt), session, url)
            assert counted.count == 8 * len(prompt), "priced by the replica's count"
            routed.setdefault(prompt, []).append(counted.block_hashes)
    first, again = routed["first prompt"]
    (other,) = routed["other prompt"]
    assert first == again, "the same prompt keeps its blocks (a retry still finds its replica)"
    assert not set(first) & set(other), "different prompts share nothing"
