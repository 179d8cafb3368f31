"""Streams through kvgate: byte-exact relay, request ids, and cancellation when the client leaves."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import uvicorn

from kvgate.gateway.edge.app import Gateway
from kvgate.gateway.edge.server import bind_socket, running_gateway
from kvgate.sim.fleet import SimFleet
from kvgate.vocabulary.replica import ReplicaLoad
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config


def recorded(fleet: SimFleet, request_id: str) -> bytes:
    """What the replica that served ``request_id`` wrote for it."""
    bodies = [r.recorded(request_id) for r in fleet.replicas]
    served = [b for b in bodies if b]
    assert len(served) == 1, f"{request_id} recorded on {len(served)} replicas"
    return served[0]


async def test_stream_bytes_are_exactly_what_the_replica_sent(fleet: SimFleet) -> None:
    async with running_gateway(gateway_config(fleet.urls)) as gw, httpx.AsyncClient(base_url=gw.url) as http:
        payloads: list[tuple[str, dict[str, Any]]] = [
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell me a story"}]}),
            ("/v1/completions", {"prompt": "The quick brown fox"}),
        ]
        for i, (path, payload) in enumerate(payloads):
            request_id = f"byte-exact-{i}"
            usage = {"include_usage": True}
            body = {"model": MODEL, "max_tokens": 40, "stream": True, "stream_options": usage, **payload}
            received = bytearray()
            async with http.stream("POST", path, json=body, headers={"x-request-id": request_id}) as response:
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/event-stream")
                async for raw in response.aiter_raw():
                    received += raw
            assert received.endswith(b"data: [DONE]\n\n")
            assert bytes(received) == recorded(fleet, request_id)
        await assert_idle(gw)


async def test_usage_the_gateway_asked_for_is_read_and_kept_from_the_client(fleet: SimFleet) -> None:
    async with running_gateway(gateway_config(fleet.urls)) as gw, httpx.AsyncClient(base_url=gw.url) as http:
        body = {"model": MODEL, "max_tokens": 30, "stream": True, "prompt": "Once upon a time"}
        received = bytearray()
        async with http.stream(
            "POST", "/v1/completions", json=body, headers={"x-request-id": "u-1"}
        ) as response:
            async for raw in response.aiter_raw():
                received += raw
        sent = recorded(fleet, "u-1")
        usage_events = [e for e in sent.split(b"\n\n") if b'"choices":[]' in e]
        assert len(usage_events) == 1, "the gateway asked the replica for usage"
        assert b'"usage"' not in received
        assert bytes(received) == sent.replace(usage_events[0] + b"\n\n", b"")
        assert received.endswith(b"data: [DONE]\n\n")
        await assert_idle(gw)


async def test_non_stream_body_is_relayed_unchanged(fleet: SimFleet) -> None:
    async with running_gateway(gateway_config(fleet.urls)) as gw, httpx.AsyncClient(base_url=gw.url) as http:
        response = await http.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "hi", "max_tokens": 5},
            headers={"x-request-id": "ns-1"},
        )
        assert response.status_code == 200
        assert response.content == recorded(fleet, "ns-1")
        await assert_idle(gw)


async def test_request_id_is_accepted_generated_propagated_and_returned(fleet: SimFleet) -> None:
    async with running_gateway(gateway_config(fleet.urls)) as gw, httpx.AsyncClient(base_url=gw.url) as http:
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 3}
        given = await http.post("/v1/completions", json=body, headers={"X-Request-Id": "client-chosen-id"})
        assert given.headers["x-request-id"] == "client-chosen-id"
        assert recorded(fleet, "client-chosen-id") == given.content

        generated = await http.post("/v1/completions", json=body)
        request_id = generated.headers["x-request-id"]
        assert re.fullmatch(r"[0-9a-f]{32}", request_id)
        assert recorded(fleet, request_id) == generated.content

        refused = await http.post("/v1/completions", content=b"{not json")
        assert re.fullmatch(r"[0-9a-f]{32}", refused.headers["x-request-id"])
        await assert_idle(gw)


async def test_client_disconnect_mid_stream_aborts_the_replica_request() -> None:
    async with (
        SimFleet(replicas=1, time_scale=1.0, seed=0) as fleet,
        running_gateway(gateway_config(fleet.urls)) as gw,
        httpx.AsyncClient(base_url=gw.url) as http,
    ):
        engine = fleet.replicas[0].engine
        body = {"model": MODEL, "prompt": "go on", "max_tokens": 4000, "ignore_eos": True, "stream": True}
        async with http.stream("POST", "/v1/completions", json=body) as response:
            chunks = response.aiter_raw()
            await anext(chunks)
            await anext(chunks)
            assert engine.num_running == 1
            assert gw.state.in_flight == 1
        assert await eventually(lambda: engine.num_running == 0)
        await assert_idle(gw)


async def test_under_another_asgi_server_streams_arrive_whole_and_end_when_their_client_leaves() -> None:
    """Plain uvicorn offers no ``REQUEST_EDGE``: every chunk goes through the request's task and
    ``send``, and a task keeping ``receive()`` pending hears the client leave."""
    async with SimFleet(replicas=1, time_scale=1.0, seed=0, record_streams=True) as fleet:
        gateway = Gateway(gateway_config(fleet.urls))
        sock = bind_socket("127.0.0.1", 0)
        config = uvicorn.Config(gateway, http="httptools", ws="none", lifespan="on", log_level="warning")
        server = uvicorn.Server(config)
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            assert await eventually(lambda: server.started)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}") as http:
                usage = {"include_usage": True}
                body = {
                    "model": MODEL,
                    "prompt": "go on",
                    "max_tokens": 20,
                    "stream": True,
                    "stream_options": usage,
                }
                received = bytearray()
                headers = {"x-request-id": "plain-uvicorn"}
                async with http.stream("POST", "/v1/completions", json=body, headers=headers) as response:
                    async for raw in response.aiter_raw():
                        received += raw
                assert received.endswith(b"data: [DONE]\n\n")
                assert bytes(received) == recorded(fleet, "plain-uvicorn")
                engine = fleet.replicas[0].engine
                body = {
                    "model": MODEL,
                    "prompt": "go on",
                    "max_tokens": 4000,
                    "ignore_eos": True,
                    "stream": True,
                }
                async with http.stream("POST", "/v1/completions", json=body) as response:
                    chunks = response.aiter_raw()
                    await anext(chunks)
                    await anext(chunks)
                    assert engine.num_running == 1
            assert await eventually(lambda: engine.num_running == 0)
            assert await eventually(lambda: gateway.state.in_flight == 0)
            assert await eventually(lambda: gateway.state.ledger.totals() == ReplicaLoad())
        finally:
            server.should_exit = True
            await serving
            sock.close()
