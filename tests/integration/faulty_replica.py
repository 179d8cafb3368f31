"""A simulated replica behind a front that misbehaves on purpose: everything passes through to the
replica (probes, ``/metrics``, KV pulls) except the completion routes, which the front answers with
a fault while one is set. The replica behind stays real, so a request the front lets through is
served, handed off and pulled exactly as without it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
import orjson
from aiohttp import web

from tests.integration.processes import serving_app

COMPLETIONS = ("/v1/completions", "/v1/chat/completions")
HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host"})


@dataclass
class Fault:
    """What the front does to a completion request: answer ``status`` itself (with ``retry_after_s``
    when given), or pass it through and take ``kv_transfer_params`` out of the answer."""

    status: int | None = None
    retry_after_s: float | None = None
    strip_kv_transfer_params: bool = False


@dataclass
class FaultyFront:
    url: str
    target: str
    fault: Fault | None = None
    faulted: int = 0
    """Completion requests the front answered with its fault."""
    passed: list[str] = field(default_factory=list)
    """Paths of the completion requests it let through."""


@asynccontextmanager
async def faulty_front(target: str, fault: Fault | None = None) -> AsyncIterator[FaultyFront]:
    """A front on a free loopback port for the replica at ``target``."""
    front = FaultyFront("", target, fault)
    session = aiohttp.ClientSession(auto_decompress=False)

    async def handle(request: web.Request) -> web.StreamResponse:
        fault = front.fault
        completion = request.method == "POST" and request.path in COMPLETIONS
        if completion and fault is not None and fault.status is not None:
            front.faulted += 1
            headers = {} if fault.retry_after_s is None else {"retry-after": str(fault.retry_after_s)}
            error = {"error": {"message": "injected", "type": "Error", "code": fault.status}}
            return web.json_response(error, status=fault.status, headers=headers)
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        async with session.request(
            request.method, target + request.path_qs, data=body, headers=headers
        ) as upstream:
            out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
            if completion and fault is not None and fault.strip_kv_transfer_params:
                front.faulted += 1
                answer = orjson.loads(await upstream.read())
                answer.pop("kv_transfer_params", None)
                return web.Response(body=orjson.dumps(answer), status=upstream.status, headers=out_headers)
            if completion:
                front.passed.append(request.path)
            response = web.StreamResponse(status=upstream.status, headers=out_headers)
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    try:
        async with serving_app(app) as url:
            front.url = url
            yield front
    finally:
        await session.close()
