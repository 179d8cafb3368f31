"""The completion routes' POST taken straight from the parser
(``kvgate.gateway.edge.http_protocol.HOT_PATHS``) against what uvicorn's own way does with the same request:
the same answer, keep-alive, pipelining, ``Expect: 100-continue`` and HTTP/1.0. Raw sockets, to send what each
case needs byte for byte."""

from __future__ import annotations

import asyncio

import orjson

from kvgate.gateway.edge.server import running_gateway
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import assert_idle
from tests.integration.test_edge_limits import (
    BOUND_S,
    SMALL_REQUEST,
    close_all,
    connect,
    edge_config,
    read_response,
    request,
    rest_until_closed,
)


def to(target: bytes, raw: bytes) -> bytes:
    """``raw`` (a request to ``/v1/completions``) sent to ``target`` instead."""
    return raw.replace(b"POST /v1/completions ", b"POST " + target + b" ", 1)


async def test_the_hot_route_and_uvicorns_way_answer_alike_on_one_kept_alive_connection(
    fleet: SimFleet,
) -> None:
    async with running_gateway(edge_config(fleet)) as gw:
        reader, writer = await connect(gw)
        answers = []
        # a query string takes uvicorn's way (the raw target is not a hot path), then the hot route
        for target in (b"/v1/completions?via=asgi", b"/v1/completions", b"/v1/completions?via=asgi"):
            writer.write(to(target, request(SMALL_REQUEST)))
            answers.append(await read_response(reader))
        for status, headers, body in answers:
            assert status == 200, body
            assert orjson.loads(body)["object"] == "text_completion"
            assert headers.get("connection") != "close"
        names = [set(headers) for _, headers, _ in answers]
        assert names[0] == names[1] == names[2]
        assert {"content-type", "content-length", "x-request-id", "date"} <= names[1]
        await close_all([(reader, writer)])
        await assert_idle(gw)


async def test_pipelined_completions_are_answered_in_order(fleet: SimFleet) -> None:
    async with running_gateway(edge_config(fleet)) as gw:
        reader, writer = await connect(gw)
        ids = [b"first", b"second", b"third"]
        writer.write(b"".join(request(SMALL_REQUEST, [b"x-request-id: " + i]) for i in ids))
        for expected in ids:
            status, headers, body = await read_response(reader)
            assert status == 200, body
            assert headers["x-request-id"] == expected.decode()
        await close_all([(reader, writer)])
        await assert_idle(gw)


async def test_expect_100_continue_on_the_hot_route_gets_its_interim_answer_first(fleet: SimFleet) -> None:
    async with running_gateway(edge_config(fleet)) as gw:
        reader, writer = await connect(gw)
        raw = request(SMALL_REQUEST, [b"expect: 100-continue"])
        head, _, body = raw.partition(b"\r\n\r\n")
        writer.write(head + b"\r\n\r\n")
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND_S)
        assert interim.startswith(b"HTTP/1.1 100 ")
        writer.write(body)
        status, _, answer = await read_response(reader)
        assert status == 200, answer
        await close_all([(reader, writer)])
        await assert_idle(gw)


async def test_an_http_1_0_request_is_answered_and_its_connection_closed(fleet: SimFleet) -> None:
    async with running_gateway(edge_config(fleet)) as gw:
        reader, writer = await connect(gw)
        writer.write(request(SMALL_REQUEST).replace(b" HTTP/1.1\r\n", b" HTTP/1.0\r\n", 1))
        status, headers, body = await read_response(reader)
        assert status == 200, body
        assert headers["connection"] == "close"
        assert await rest_until_closed(reader) == b""
        await close_all([(reader, writer)])
        await assert_idle(gw)


async def test_a_kept_alive_connection_closes_once_idle_for_the_keepalive_not_before(fleet: SimFleet) -> None:
    """The keep-alive timer is the connection's: set by the first response, it fires while the
    connection has been idle for less than the keep-alive and must wait out the rest, not close."""
    async with running_gateway(edge_config(fleet, client_keepalive_s=1)) as gw:
        reader, writer = await connect(gw)
        for _ in range(3):  # the second and third requests come after the first timer is due
            writer.write(request(SMALL_REQUEST))
            status, _, body = await read_response(reader)
            assert status == 200, body
            await asyncio.sleep(0.6)
        assert await rest_until_closed(reader) == b""
        await close_all([(reader, writer)])
        await assert_idle(gw)
