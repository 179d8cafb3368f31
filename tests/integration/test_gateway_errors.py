"""Bad input, limits and broken replicas: always an OpenAI-shaped body, never a traceback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from aiohttp import web

from kvgate.gateway.edge.server import running_gateway
from kvgate.sim.fleet import SimFleet
from kvgate.sim.ports import free_ports
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config


def openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error: dict[str, Any] = response.json()["error"]
    assert (
        {"message", "type", "param", "code"} <= set(error) <= {"message", "type", "param", "code", "reason"}
    )
    assert error["code"] == status
    return error


async def test_bad_requests_are_refused_before_any_replica(fleet: SimFleet) -> None:
    config = gateway_config(fleet.urls, server={"port": 0, "max_body_bytes": 2000})
    async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url) as http:
        malformed = await http.post("/v1/chat/completions", content=b'{"model": ')
        assert "not valid JSON" in openai_error(malformed, 400)["message"]

        not_object = await http.post("/v1/completions", content=b"[1, 2]")
        openai_error(not_object, 400)

        no_model = await http.post("/v1/completions", json={"prompt": "x"})
        assert openai_error(no_model, 400)["param"] == "model"

        too_big = await http.post("/v1/completions", json={"model": MODEL, "prompt": "x" * 3000})
        openai_error(too_big, 413)

        chunked = await http.post(
            "/v1/completions", content=_chunks(b'{"model": "m", "prompt": "' + b"y" * 3000)
        )
        openai_error(chunked, 413)

        unknown = await http.post("/v1/chat/completions", json={"model": "gpt-9", "messages": []})
        error = openai_error(unknown, 404)
        assert error["message"] == "The model `gpt-9` does not exist."
        assert error["type"] == "NotFoundError"

        wrong_method = await http.get("/v1/chat/completions")
        openai_error(wrong_method, 405)
        wrong_admin_method = await http.post("/v1/models")
        openai_error(wrong_admin_method, 405)
        no_route = await http.get("/v1/nothing-here")
        openai_error(no_route, 404)

        assert all(r.engine.num_running == 0 for r in fleet.replicas)
        assert gw.state.served == 0
        await assert_idle(gw)


async def _chunks(data: bytes) -> Any:
    for i in range(0, len(data), 500):
        yield data[i : i + 500]


async def test_replica_4xx_passes_through_as_written(fleet: SimFleet) -> None:
    async with running_gateway(gateway_config(fleet.urls)) as gw, httpx.AsyncClient(base_url=gw.url) as http:
        response = await http.post(
            "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2, "min_tokens": 5}
        )
        error = openai_error(response, 400)
        assert "min_tokens" in error["message"]
        assert gw.state.served == 1
        await assert_idle(gw)


async def test_no_reachable_replica_is_503_with_retry_after() -> None:
    config = gateway_config([f"http://127.0.0.1:{free_ports()}"])
    async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url) as http:
        response = await http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2})
        openai_error(response, 503)
        assert int(response.headers["retry-after"]) >= 1
        assert (await http.get("/readyz")).status_code == 200, "the gateway itself can serve"
        assert (await http.get("/fleetz")).status_code == 503
        assert (await http.get("/healthz")).status_code == 200
        await assert_idle(gw)


async def test_replica_dying_after_its_health_check_is_502() -> None:
    async with SimFleet(replicas=1, time_scale=0.0) as fleet:
        config = gateway_config(fleet.urls, health={"interval_s": 3600})
        async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url) as http:
            assert (await http.get("/readyz")).status_code == 200
            await fleet.kill(0)
            response = await http.post(
                "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2}
            )
            assert "cannot connect" in openai_error(response, 502)["message"]
            await assert_idle(gw)


async def test_health_checks_take_a_dead_replica_out_and_fleetz_follows(fleet: SimFleet) -> None:
    async with running_gateway(gateway_config(fleet.urls)) as gw, httpx.AsyncClient(base_url=gw.url) as http:
        fleetz = (await http.get("/fleetz")).json()
        assert fleetz == {"ready": True, "models": {MODEL: {"routable_replicas": 2}}}
        await fleet.kill(0)
        assert await eventually(lambda: sum(r.healthy for r in gw.state.replicas.values()) == 1)
        for _ in range(4):
            response = await http.post(
                "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2}
            )
            assert response.status_code == 200
        await fleet.kill(1)
        assert await eventually(lambda: not gw.state.ready)
        assert (await http.get("/fleetz")).status_code == 503
        assert (await http.get("/readyz")).status_code == 200
        await assert_idle(gw)


async def test_admin_routes(fleet: SimFleet) -> None:
    async with running_gateway(gateway_config(fleet.urls)) as gw, httpx.AsyncClient(base_url=gw.url) as http:
        models = (await http.get("/v1/models")).json()
        assert models["object"] == "list"
        assert [(m["id"], m["max_model_len"]) for m in models["data"]] == [(MODEL, 131072)]
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        metrics = await http.get("/metrics")
        assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
        assert (await http.get("/openapi.json")).json()["info"]["title"] == "kvgate"
        await assert_idle(gw)


async def test_dns_pool_discovers_replicas(fleet: SimFleet) -> None:
    port = fleet.replicas[0].port
    config = gateway_config(
        [],
        pools=[{"name": "dns", "dns": {"name": "localhost", "port": port}, "kv_capacity_tokens": 1000}],
    )
    async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url) as http:
        assert f"http://127.0.0.1:{port}" in gw.state.replicas
        response = await http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2})
        assert response.status_code == 200
        await assert_idle(gw)


async def test_first_byte_timeout_is_504_and_aborts_the_replica_request() -> None:
    async with SimFleet(replicas=1, time_scale=1.0) as fleet:
        config = gateway_config(fleet.urls, server={"port": 0, "timeouts": {"first_byte_s": 0.3}})
        async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url) as http:
            body = {"model": MODEL, "prompt": "x", "max_tokens": 4000, "ignore_eos": True}
            response = await http.post("/v1/completions", json=body)
            assert "timed out" in openai_error(response, 504)["message"]
            assert await eventually(lambda: fleet.replicas[0].engine.num_running == 0)
            await assert_idle(gw)


async def test_idle_stream_ends_with_an_error_event() -> None:
    async with SimFleet(replicas=1, time_scale=1.0) as fleet:
        config = gateway_config(fleet.urls, server={"port": 0, "timeouts": {"idle_s": 0.3}})
        async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url) as http:
            body = {"model": MODEL, "prompt": "x", "max_tokens": 4000, "ignore_eos": True, "stream": True}
            received = bytearray()
            async with http.stream("POST", "/v1/completions", json=body) as response:
                assert response.status_code == 200
                async for raw in response.aiter_raw():
                    if not received:
                        await fleet.pause(0)
                    received += raw
            *_, error_event, done_event = bytes(received).rstrip(b"\n").split(b"\n\n")
            assert error_event.startswith(b'data: {"error":')
            assert b"GatewayTimeoutError" in error_event
            assert done_event == b"data: [DONE]"
            assert received.count(b"[DONE]") == 1
            await fleet.resume(0)
            await assert_idle(gw)


@asynccontextmanager
async def failing_replica(status: int) -> AsyncIterator[str]:
    """A replica whose health check passes and whose completions answer ``status`` with a vLLM-shaped body."""

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    async def complete(request: web.Request) -> web.Response:
        body = {
            "error": {"message": "engine died", "type": "InternalServerError", "param": None, "code": status}
        }
        return web.json_response(body, status=status)

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/completions", complete)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_replica_5xx_becomes_a_gateway_error() -> None:
    for status, expected in ((500, 502), (503, 503)):
        async with (
            failing_replica(status) as url,
            running_gateway(gateway_config([url])) as gw,
            httpx.AsyncClient(base_url=gw.url) as http,
        ):
            response = await http.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
            error = openai_error(response, expected)
            assert "engine died" in error["message"]
            assert ("retry-after" in response.headers) == (expected == 503)
            await assert_idle(gw)


async def test_a_bug_behind_the_edge_is_an_openai_shaped_500_and_leaks_nothing(
    fleet: SimFleet, monkeypatch: Any
) -> None:
    """A fault injected after the reservation is taken (the tracing hook of an upstream attempt
    raising, as a bug there would): the client gets an OpenAI-shaped 500, not uvicorn's plain
    text, and the reservation is released. Tracing is the one object on that path the compiled
    build leaves interpreted, so the fault goes in the same way on both builds."""
    config = gateway_config(fleet.urls, tracing={"enabled": True, "exporter": "none"})
    async with running_gateway(config) as gw:
        tracing = gw.gateway.tracing
        assert tracing is not None

        reserved: list[int] = []

        def broken_upstream(*_: Any) -> None:
            reserved.append(gw.state.ledger.totals().resident_sequences)
            raise RuntimeError("a bug")

        monkeypatch.setattr(tracing, "upstream", broken_upstream)
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            answer = await http.post(
                "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 4}
            )
        assert answer.status_code == 500
        assert answer.json()["error"]["type"] == "InternalServerError"
        assert reserved == [1], "the fault came after the reservation was taken"
        await assert_idle(gw)
