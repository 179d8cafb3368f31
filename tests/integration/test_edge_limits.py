"""The HTTP edge against hostile or broken clients: idle and slow connections, oversized headers, a
flood of connections, and a client that stops reading its stream. Raw sockets, because an HTTP
client library never sends what these clients send."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import orjson

from kvgate.gateway.edge.edge_limits import RESERVED_DESCRIPTORS, connection_cap, raise_descriptor_limit
from kvgate.gateway.edge.server import RunningGateway, running_gateway
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config

BOUND_S = 30.0
"""A generous bound on anything the gateway does within a second: only a gateway that never does
it runs into this."""

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]
PARTIAL_HEAD = b"POST /v1/completions HTTP/1.1\r\nhost: kvgate\r\n"
SMALL_REQUEST: dict[str, Any] = {"model": MODEL, "prompt": "hi", "max_tokens": 3}


def edge_config(fleet: SimFleet, **server: Any) -> Any:
    return gateway_config(fleet.urls, server={"port": 0, **server})


async def connect(
    gw: RunningGateway, *, rcvbuf_bytes: int | None = None, sndbuf_bytes: int | None = None
) -> Connection:
    url = urlsplit(gw.url)
    assert url.hostname is not None and url.port is not None
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf_bytes is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf_bytes)
    if sndbuf_bytes is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf_bytes)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (url.hostname, url.port))
    return await asyncio.open_connection(sock=sock)


def request(body: dict[str, Any], headers: Sequence[bytes] = ()) -> bytes:
    raw = orjson.dumps(body)
    head = [
        b"POST /v1/completions HTTP/1.1",
        b"host: kvgate",
        b"content-type: application/json",
        b"content-length: %d" % len(raw),
        *headers,
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + raw


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND_S)
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    body = await asyncio.wait_for(reader.readexactly(length), BOUND_S)
    return int(status_line.split()[1]), headers, body


async def rest_until_closed(reader: asyncio.StreamReader) -> bytes:
    """Whatever the gateway still sends before it closes the connection."""
    received = bytearray()
    with contextlib.suppress(ConnectionResetError):
        while chunk := await asyncio.wait_for(reader.read(1 << 16), BOUND_S):
            received += chunk
    return bytes(received)


def assert_openai_error(
    status: int, headers: dict[str, str], body: bytes, expected: int, *, closes: bool = True
) -> None:
    assert status == expected, body
    assert headers["content-type"] == "application/json"
    assert (headers.get("connection") == "close") == closes
    error = orjson.loads(body)["error"]
    assert error["code"] == expected and error["message"] and error["type"]


async def close_all(connections: Sequence[Connection]) -> None:
    for _, writer in connections:
        writer.close()
    for _, writer in connections:
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(fleet: SimFleet) -> None:
    async with running_gateway(edge_config(fleet, header_timeout_s=0.5)) as gw:
        reader, writer = await connect(gw)
        assert await rest_until_closed(reader) == b"", "no request, so no answer: only a close"
        await close_all([(reader, writer)])
        assert await eventually(lambda: gw.client_connections == 0)
        await assert_idle(gw)


async def test_headers_trickled_slower_than_the_header_timeout_get_408(fleet: SimFleet) -> None:
    async with running_gateway(edge_config(fleet, header_timeout_s=0.5)) as gw:
        reader, writer = await connect(gw)
        writer.write(PARTIAL_HEAD + b"x-slow: ")

        async def trickle() -> None:
            while not writer.is_closing():
                writer.write(b"a")
                await asyncio.sleep(0.05)

        trickler = asyncio.create_task(trickle())
        assert_openai_error(*await read_response(reader), 408)
        assert await rest_until_closed(reader) == b""
        trickler.cancel()
        await close_all([(reader, writer)])
        assert await eventually(lambda: gw.client_connections == 0)
        await assert_idle(gw)


async def test_a_later_request_on_a_kept_alive_connection_has_the_header_timeout_too(
    fleet: SimFleet,
) -> None:
    async with running_gateway(edge_config(fleet, header_timeout_s=0.5)) as gw:
        reader, writer = await connect(gw)
        writer.write(request(SMALL_REQUEST))
        status, _, _ = await read_response(reader)
        assert status == 200
        writer.write(PARTIAL_HEAD)
        assert_openai_error(*await read_response(reader), 408)
        assert await rest_until_closed(reader) == b""
        await close_all([(reader, writer)])
        await assert_idle(gw)


async def test_a_body_that_stops_coming_gets_408_and_never_reaches_a_replica(fleet: SimFleet) -> None:
    async with running_gateway(edge_config(fleet, body_timeout_s=0.5)) as gw:
        reader, writer = await connect(gw)
        writer.write(request(SMALL_REQUEST)[:-5])
        assert_openai_error(*await read_response(reader), 408)
        assert await rest_until_closed(reader) == b""
        await close_all([(reader, writer)])
        assert all(not any(r.engine.stats.request_success.values()) for r in fleet.replicas)
        assert await eventually(lambda: gw.client_connections == 0)
        await assert_idle(gw)


async def test_a_request_answered_before_its_body_arrived_gets_no_second_answer(fleet: SimFleet) -> None:
    """The 413 for a declared length over the limit goes out at once; when the client then stalls,
    the body timeout closes the connection without writing a 408 after that 413."""
    config = edge_config(fleet, body_timeout_s=0.5, max_body_bytes=1000)
    async with running_gateway(config) as gw:
        reader, writer = await connect(gw)
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nhost: kvgate\r\ncontent-length: 5000\r\n\r\n" + b"x" * 100
        )
        assert_openai_error(*await read_response(reader), 413, closes=False)
        assert await rest_until_closed(reader) == b""
        await close_all([(reader, writer)])
        await assert_idle(gw)


async def test_a_body_that_keeps_coming_outlasts_the_body_timeout(fleet: SimFleet) -> None:
    """The body timeout is between two reads, not for the whole body (at a rate above the minimum)."""
    async with running_gateway(edge_config(fleet, body_timeout_s=1.0, body_min_rate_bytes_per_s=8)) as gw:
        reader, writer = await connect(gw)
        raw = request(SMALL_REQUEST)
        cut = raw.index(b"\r\n\r\n") + 4
        writer.write(raw[:cut])
        for i in range(cut, len(raw), 8):
            writer.write(raw[i : i + 8])
            await asyncio.sleep(0.25)
        status, _, _ = await read_response(reader)
        assert status == 200
        await close_all([(reader, writer)])
        await assert_idle(gw)


async def test_a_body_trickled_below_the_minimum_rate_gets_408_though_no_gap_is_long(fleet: SimFleet) -> None:
    """A byte every 0.2 s never trips a 1 s timeout between reads; the minimum rate cuts it."""
    config = edge_config(fleet, body_timeout_s=1.0, body_min_rate_bytes_per_s=100)
    async with running_gateway(config) as gw:
        reader, writer = await connect(gw)
        raw = request({**SMALL_REQUEST, "prompt": "x" * 400})
        cut = raw.index(b"\r\n\r\n") + 4
        writer.write(raw[:cut])
        answered = asyncio.create_task(read_response(reader))
        for i in range(cut, len(raw)):
            if answered.done():
                break
            with contextlib.suppress(ConnectionError):
                writer.write(raw[i : i + 1])
            await asyncio.sleep(0.2)
        assert answered.done(), "the body was cut before it all arrived"
        status, _, body = answered.result()
        assert status == 408 and b"slower than 100 bytes/s" in body
        await close_all([(reader, writer)])
        assert all(not any(r.engine.stats.request_success.values()) for r in fleet.replicas)
        await assert_idle(gw)


async def test_each_client_connection_has_a_bounded_send_buffer(fleet: SimFleet) -> None:
    """So a client that stops reading is noticed once that much is unread, not after megabytes."""
    async with running_gateway(edge_config(fleet, client_send_buffer_bytes=65536)) as gw:
        reader, writer = await connect(gw)
        writer.write(request(SMALL_REQUEST))
        assert (await read_response(reader))[0] == 200
        (protocol,) = gw.server.server_state.connections
        sock = protocol.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == 2 * 65536, "Linux doubles it"
        await close_all([(reader, writer)])
        await assert_idle(gw)


async def test_a_header_section_over_the_byte_limit_gets_431_and_is_not_read(fleet: SimFleet) -> None:
    async with running_gateway(edge_config(fleet, max_header_bytes=16384)) as gw:
        reader, writer = await connect(gw, sndbuf_bytes=1 << 16)
        total_bytes = 16 << 20
        sent_bytes = 0

        async def send_huge_header() -> None:
            nonlocal sent_bytes
            writer.write(PARTIAL_HEAD + b"x-big: ")
            chunk = b"a" * (1 << 16)
            while sent_bytes < total_bytes:
                writer.write(chunk)
                await writer.drain()
                sent_bytes += len(chunk)

        sender = asyncio.create_task(send_huge_header())
        assert_openai_error(*await read_response(reader), 431)
        assert await rest_until_closed(reader) == b""
        assert await eventually(lambda: sender.done())
        assert isinstance(sender.exception(), ConnectionError), "the gateway stopped reading"
        assert sent_bytes < total_bytes
        await close_all([(reader, writer)])
        assert await eventually(lambda: gw.client_connections == 0)
        await assert_idle(gw)


async def test_more_headers_than_the_limit_get_431(fleet: SimFleet) -> None:
    async with running_gateway(edge_config(fleet, max_headers=20)) as gw:
        reader, writer = await connect(gw)
        at_limit = [b"x-h%d: v" % i for i in range(17)]
        writer.write(request(SMALL_REQUEST, at_limit))
        status, _, _ = await read_response(reader)
        assert status == 200, "host, content-type, content-length and 17 more: 20 headers"
        writer.write(request(SMALL_REQUEST, [*at_limit, b"x-one-too-many: v"]))
        assert_openai_error(*await read_response(reader), 431)
        assert await rest_until_closed(reader) == b""
        await close_all([(reader, writer)])
        await assert_idle(gw)


async def test_a_request_that_is_not_http_gets_an_openai_shaped_400(fleet: SimFleet) -> None:
    async with running_gateway(edge_config(fleet)) as gw:
        reader, writer = await connect(gw)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nbad header line\r\n\r\n")
        assert_openai_error(*await read_response(reader), 400)
        assert await rest_until_closed(reader) == b""
        await close_all([(reader, writer)])
        await assert_idle(gw)


async def test_at_the_connection_cap_a_new_connection_closes_the_longest_idle_one(fleet: SimFleet) -> None:
    async with running_gateway(edge_config(fleet, max_connections=8, header_timeout_s=60)) as gw:
        oldest = [await connect(gw) for _ in range(3)]
        assert await eventually(lambda: gw.client_connections == 3)
        newer = [await connect(gw) for _ in range(5)]
        assert await eventually(lambda: gw.client_connections == 8)
        late = [await connect(gw) for _ in range(3)]
        for reader, _ in oldest:
            assert await rest_until_closed(reader) == b"", "idle: closed without an answer"
        served = await connect(gw)
        served[1].write(request(SMALL_REQUEST))
        status, _, _ = await read_response(served[0])
        assert status == 200
        assert await rest_until_closed(newer[0][0]) == b"", "the next longest idle made room"
        assert await eventually(lambda: gw.client_connections == 8)
        await close_all([*oldest, *newer, *late, served])
        assert await eventually(lambda: gw.client_connections == 0)
        await assert_idle(gw)


async def test_at_the_cap_with_none_idle_new_connections_get_503_until_slow_ones_are_reaped(
    fleet: SimFleet,
) -> None:
    async with running_gateway(edge_config(fleet, max_connections=6, header_timeout_s=3)) as gw:
        slow = [await connect(gw) for _ in range(6)]
        for _, writer in slow:
            writer.write(PARTIAL_HEAD)
        assert await eventually(lambda: gw.client_connections == 6)
        await asyncio.sleep(0.2)
        refused = [await connect(gw) for _ in range(3)]
        for reader, _ in refused:
            status, headers, body = await read_response(reader)
            assert_openai_error(status, headers, body, 503)
            assert int(headers["retry-after"]) >= 1
            assert await rest_until_closed(reader) == b""
        for reader, _ in slow:
            assert_openai_error(*await read_response(reader), 408)
        assert await eventually(lambda: gw.client_connections == 0), "reaped, lingered and closed"
        served = await connect(gw)
        served[1].write(request(SMALL_REQUEST))
        status, _, _ = await read_response(served[0])
        assert status == 200
        await close_all([*slow, *refused, served])
        assert await eventually(lambda: gw.client_connections == 0)
        await assert_idle(gw)


async def test_a_client_that_stops_reading_its_stream_is_cut_and_its_request_cancelled() -> None:
    async with SimFleet(replicas=1, time_scale=0.0, seed=0) as sim:
        config = gateway_config(
            sim.urls,
            server={"port": 0, "send_timeout_s": 0.5},
            admission={"max_output_tokens_ceiling": 120000},
        )
        async with running_gateway(config) as gw:
            reader, writer = await connect(gw, rcvbuf_bytes=4096)
            stream = {**SMALL_REQUEST, "max_tokens": 120000, "ignore_eos": True, "stream": True}
            writer.write(request(stream))
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND_S)
            assert head.startswith(b"HTTP/1.1 200 "), head + await reader.read(1000)
            assert await eventually(lambda: gw.state.in_flight == 0, BOUND_S), "the gateway let it go"
            rest = await rest_until_closed(reader)
            assert b"[DONE]" not in rest, "cut, not finished"
            engine = sim.replicas[0].engine
            assert await eventually(lambda: engine.num_running == 0)
            assert engine.stats.request_success["abort"] == 1, "cancelled upstream"
            await close_all([(reader, writer)])
            await assert_idle(gw)


def test_the_connection_cap_leaves_descriptors_for_upstream_connections() -> None:
    spare = 1024 - RESERVED_DESCRIPTORS
    assert connection_cap(10000, 8192, 1 << 20) == 10000, "room for both: the configured cap"
    assert connection_cap(10000, 8192, 1024) == spare // 2, "at least half of what is left"
    assert connection_cap(10000, 100, 1024) == spare - 100, "all but a small upstream pool"
    assert connection_cap(300, 100, 1024) == 300
    assert connection_cap(10000, 8192, 10) >= 1


def test_the_descriptor_soft_limit_is_raised_to_the_hard_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = min(soft, 512)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard))
    try:
        raised = raise_descriptor_limit()
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == raised
        assert raised == hard or hard == resource.RLIM_INFINITY
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_a_stream_slower_than_the_send_timeout_is_not_cut_while_its_client_reads() -> None:
    """The send timeout counts only while the client refuses bytes, not while the replica is
    silent: a stream whose every gap is longer than the timeout arrives whole."""
    async with SimFleet(replicas=1, time_scale=30.0, seed=0) as sim:
        config = gateway_config(sim.urls, server={"port": 0, "send_timeout_s": 0.1})
        async with running_gateway(config) as gw:
            reader, writer = await connect(gw)
            loop = asyncio.get_running_loop()
            writer.write(request({**SMALL_REQUEST, "max_tokens": 6, "ignore_eos": True, "stream": True}))
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND_S)
            assert head.startswith(b"HTTP/1.1 200 ")
            received = bytearray()
            gaps_s = []
            last_s = loop.time()
            while not received.endswith(b"0\r\n\r\n"):
                chunk = await asyncio.wait_for(reader.read(1 << 16), BOUND_S)
                assert chunk, "the gateway closed the stream"
                gaps_s.append(loop.time() - last_s)
                last_s = loop.time()
                received += chunk
            assert b"data: [DONE]" in received
            assert max(gaps_s) > 0.1, "the replica was silent for longer than the send timeout"
            await close_all([(reader, writer)])
            await assert_idle(gw)


async def test_a_stream_whose_client_reads_late_arrives_whole_and_in_order(fleet: SimFleet) -> None:
    """Chunks the edge cannot write at once (the client's socket is full) go through the request's
    task and ``send``; those arriving meanwhile queue behind them and never overtake them."""
    async with running_gateway(edge_config(fleet, client_send_buffer_bytes=4096)) as gw:
        reader, writer = await connect(gw, rcvbuf_bytes=4096)
        body = {
            **SMALL_REQUEST,
            "max_tokens": 2000,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        writer.write(request(body, [b"x-request-id: late-reader"]))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND_S)
        assert head.startswith(b"HTTP/1.1 200 ") and b"transfer-encoding: chunked" in head
        (protocol,) = gw.server.server_state.connections
        assert await eventually(lambda: protocol.flow.write_paused), "the client's socket never filled"
        received = bytearray()
        while True:
            size = int(await asyncio.wait_for(reader.readuntil(b"\r\n"), BOUND_S), 16)
            received += await asyncio.wait_for(reader.readexactly(size + 2), BOUND_S)
            del received[-2:]
            if size == 0:
                break
        served = [r.recorded("late-reader") for r in fleet.replicas]
        assert bytes(received) in served and received.endswith(b"data: [DONE]\n\n")
        await close_all([(reader, writer)])
        await assert_idle(gw)
