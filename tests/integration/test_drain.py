"""Graceful drain and readiness. ``kvgate serve`` as its own process gets SIGTERM with streams in
flight: readiness fails at once, requests are still taken for ``server.drain_delay_s``, then new
ones get a 503 with Retry-After while the streams run to their end (or, past
``server.drain_timeout_s``, end with an error event and ``[DONE]``), and the process exits 0.
Readiness means "this gateway can serve": a fleet that is down leaves it ready (its requests get
kvgate's 503 and ``/fleetz`` says why), a stopped admission pump does not."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson

from kvgate.config.gateway import GatewayConfig
from kvgate.gateway.edge.server import RunningGateway, running_gateway
from kvgate.sim.fleet import SimFleet
from kvgate.sim.ports import free_ports
from tests.integration import processes
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config
from tests.integration.processes import gauges

TIME_SCALE = 4.0
"""Simulated decode steps of about 10 ms take 40 ms: a stream of 100 tokens lasts about 4 s."""


@asynccontextmanager
async def kvgate_serve(
    tmp_path: Path, urls: list[str], **server: Any
) -> AsyncIterator[tuple[str, asyncio.subprocess.Process]]:
    """``kvgate serve`` in front of ``urls`` with ``server`` settings (the drain's)."""
    port = free_ports()
    config = {
        "server": {"host": "127.0.0.1", "port": port, **server},
        "health": {"interval_s": 0.2, "timeout_s": 1.0},
        "models": [{"name": MODEL, "max_model_len": 131072, "kv_bytes_per_token": 131072}],
        "pools": [{"name": "default", "replicas": urls, "kv_capacity_tokens": 450000}],
    }
    async with processes.serving_process(tmp_path, config) as served:
        yield served


async def open_stream(http: aiohttp.ClientSession, url: str, max_tokens: int) -> aiohttp.ClientResponse:
    """A completion stream whose first event has arrived (so it is in flight at the gateway)."""
    response = await http.post(
        url + "/v1/completions",
        json={
            "model": MODEL,
            "prompt": "tell a long story",
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        },
    )
    assert response.status == 200
    await response.content.readuntil(b"\n\n")
    return response


async def rest_of(response: aiohttp.ClientResponse) -> list[dict[str, Any] | str]:
    """The stream's remaining events: parsed JSON, or ``"[DONE]"``."""
    body = await response.read()
    events: list[dict[str, Any] | str] = []
    for event in body.split(b"\n\n"):
        if event.startswith(b"data: "):
            data = event[6:]
            events.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
    return events


def total(values: dict[str, float], name: str) -> float:
    return sum(v for sample, v in values.items() if sample.partition("{")[0] == name)


async def completion(http: aiohttp.ClientSession, url: str) -> tuple[int, Any, bytes]:
    """Status, headers and body of a short completion."""
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
    async with http.post(url + "/v1/completions", json=body) as response:
        return response.status, response.headers, await response.read()


async def test_sigterm_fails_readiness_then_lets_streams_finish_and_exits_0(tmp_path: Path) -> None:
    async with (
        SimFleet(replicas=2, time_scale=TIME_SCALE) as fleet,
        kvgate_serve(tmp_path, fleet.urls, drain_delay_s=2.0, drain_timeout_s=120.0) as (url, process),
        aiohttp.ClientSession() as http,
    ):
        streams = [await open_stream(http, url, max_tokens=100) for _ in range(4)]
        process.send_signal(signal.SIGTERM)
        for _ in range(200):
            async with http.get(url + "/readyz") as ready:
                if ready.status == 503:
                    assert (await ready.json())["reason"] == "draining"
                    break
            await asyncio.sleep(0.01)
        assert ready.status == 503
        status, _, _ = await completion(http, url)
        assert status == 200, "requests are taken while endpoints propagate"
        for _ in range(600):
            status, headers, body = await completion(http, url)
            if status != 200:
                break
            await asyncio.sleep(0.05)
        assert status == 503
        assert int(headers["retry-after"]) >= 1
        assert headers["connection"] == "close"
        error = orjson.loads(body)["error"]
        assert error["code"] == 503 and error["reason"] == "draining"
        held = await gauges(url)
        assert total(held, "kvgate_resident_sequences") == len(streams), held
        assert total(held, "kvgate_queued_requests") == 0, held
        for response in streams:
            events = await rest_of(response)
            assert events[-1] == "[DONE]"
            usage = [e["usage"] for e in events if isinstance(e, dict) and e.get("usage")]
            assert usage and usage[-1]["completion_tokens"] == 100
            assert not any(isinstance(e, dict) and "error" in e for e in events)
        assert await asyncio.wait_for(process.wait(), 60) == 0


async def test_streams_past_the_drain_timeout_end_with_an_error_event_and_done(tmp_path: Path) -> None:
    async with (
        SimFleet(replicas=2, time_scale=TIME_SCALE) as fleet,
        kvgate_serve(tmp_path, fleet.urls, drain_delay_s=0.2, drain_timeout_s=0.5) as (url, process),
        aiohttp.ClientSession() as http,
    ):
        streams = [await open_stream(http, url, max_tokens=2000) for _ in range(3)]
        long_answer = {"model": MODEL, "prompt": "x", "max_tokens": 2000, "ignore_eos": True}
        not_streamed = asyncio.ensure_future(http.post(url + "/v1/completions", json=long_answer))
        assert await eventually(lambda: sum(r.engine.num_running for r in fleet.replicas) == 4)
        process.send_signal(signal.SIGTERM)
        for response in streams:
            events = await rest_of(response)
            assert events[-1] == "[DONE]"
            errors = [e["error"] for e in events if isinstance(e, dict) and "error" in e]
            assert len(errors) == 1 and errors[0]["code"] == 503 and errors[0]["reason"] == "draining"
            assert events[-2] == {"error": errors[0]}
        cut = await not_streamed
        assert cut.status == 503
        assert int(cut.headers["retry-after"]) >= 1
        assert (await cut.json())["error"]["reason"] == "draining"
        cut.release()
        assert await asyncio.wait_for(process.wait(), 60) == 0


async def test_a_fleet_down_leaves_the_gateway_ready_and_fleetz_says_why() -> None:
    async with SimFleet(replicas=2, time_scale=0.0) as fleet:
        config = gateway_config(fleet.urls)
        async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url) as http:
            fleetz = await http.get("/fleetz")
            assert fleetz.status_code == 200
            assert fleetz.json() == {"ready": True, "models": {MODEL: {"routable_replicas": 2}}}
            await fleet.kill(0)
            await fleet.kill(1)
            assert await eventually(lambda: not gw.state.ready)
            ready = await http.get("/readyz")
            assert ready.status_code == 200 and ready.json() == {"ready": True}
            fleetz = await http.get("/fleetz")
            assert fleetz.status_code == 503
            assert fleetz.json() == {"ready": False, "models": {MODEL: {"routable_replicas": 0}}}
            response = await http.post(
                "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2}
            )
            assert response.status_code == 503
            assert int(response.headers["retry-after"]) >= 1
            await assert_idle(gw)


async def test_a_stopped_admission_pump_fails_readiness(fleet: SimFleet) -> None:
    async with running_gateway(gateway_config(fleet.urls)) as gw, httpx.AsyncClient(base_url=gw.url) as http:
        assert (await http.get("/readyz")).status_code == 200
        pump = next(t for t in asyncio.all_tasks() if t.get_name() == "kvgate-admission-pump")
        pump.cancel()
        assert await eventually(pump.done)
        ready = await http.get("/readyz")
        assert ready.status_code == 503
        assert ready.json() == {"ready": False, "reason": "admission_pump_stopped"}
        await assert_idle(gw)


async def test_a_drain_in_process_finishes_a_stream_and_holds_nothing() -> None:
    async with SimFleet(replicas=1, time_scale=TIME_SCALE) as fleet:
        config = gateway_config(fleet.urls, server={"port": 0, "drain_delay_s": 0.2, "drain_timeout_s": 60})
        async with running_gateway(config) as gw, aiohttp.ClientSession() as http:
            stream = await open_stream(http, gw.url, max_tokens=60)
            host, port = gw.url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET /healthz HTTP/1.1\r\nhost: kvgate\r\n\r\n")
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            await reader.readexactly(len(b'{"status":"ok"}'))
            gw.server.handle_exit(signal.SIGTERM, None)
            async with http.get(gw.url + "/readyz") as ready:
                assert ready.status == 503
            assert await asyncio.wait_for(reader.read(), 30) == b"", "an idle connection is closed"
            writer.close()
            assert gw.server.server_state.tasks, "while the stream goes on"
            events = await rest_of(stream)
            assert events[-1] == "[DONE]"
            await gw.serving
            await assert_idle(gw)


def queueing_config(urls: list[str], drain_timeout_s: float) -> GatewayConfig:
    """Room for four requests of a short prompt and 240 output tokens (16 blocks each of the 64):
    a fifth waits in the admission queue."""
    pool = {"name": "default", "replicas": urls, "kv_capacity_tokens": 1024, "max_sequences": 16}
    return gateway_config(
        urls,
        pools=[pool],
        admission={"max_queue_wait_s": 300},
        server={"port": 0, "drain_delay_s": 0.1, "drain_timeout_s": drain_timeout_s},
    )


async def fill_and_queue(
    http: aiohttp.ClientSession, url: str, gw: RunningGateway
) -> tuple[list[aiohttp.ClientResponse], asyncio.Future[tuple[int, Any, bytes]]]:
    holders = [await open_stream(http, url, max_tokens=240) for _ in range(4)]

    async def queued() -> tuple[int, Any, bytes]:
        body = {"model": MODEL, "prompt": "queued", "max_tokens": 240, "ignore_eos": True}
        async with http.post(url + "/v1/completions", json=body) as response:
            return response.status, response.headers, await response.read()

    waiter = asyncio.ensure_future(queued())
    assert await eventually(lambda: gw.state.queued == 1)
    return holders, waiter


async def test_a_request_queued_at_sigterm_is_admitted_during_the_drain() -> None:
    async with (
        SimFleet(replicas=1, time_scale=1.0) as fleet,
        running_gateway(queueing_config(fleet.urls, 120.0)) as gw,
        aiohttp.ClientSession() as http,
    ):
        holders, waiter = await fill_and_queue(http, gw.url, gw)
        gw.server.handle_exit(signal.SIGTERM, None)
        for response in holders:
            assert (await rest_of(response))[-1] == "[DONE]"
        status, _, body = await waiter
        assert status == 200, body
        assert orjson.loads(body)["usage"]["completion_tokens"] == 240
        await gw.serving
        await assert_idle(gw)


async def test_at_the_drain_timeout_a_queued_request_gets_503_and_nothing_is_held() -> None:
    async with (
        SimFleet(replicas=1, time_scale=TIME_SCALE) as fleet,
        running_gateway(queueing_config(fleet.urls, 0.3)) as gw,
        aiohttp.ClientSession() as http,
    ):
        holders, waiter = await fill_and_queue(http, gw.url, gw)
        gw.server.handle_exit(signal.SIGTERM, None)
        status, headers, body = await waiter
        assert status == 503 and int(headers["retry-after"]) >= 1
        assert orjson.loads(body)["error"]["reason"] == "draining"
        for response in holders:
            events = await rest_of(response)
            assert events[-1] == "[DONE]"
            assert isinstance(events[-2], dict) and events[-2]["error"]["reason"] == "draining"
        await gw.serving
        await assert_idle(gw)
