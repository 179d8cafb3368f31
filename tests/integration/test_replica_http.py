"""The completion routes' replica client against real loopback servers, on both event loops the
gateway runs on (the default asyncio loop and uvloop): keep-alive reuse, chunked and
EOF-delimited bodies, a stale pooled connection, a replica dying mid-response, timeouts, flow
control, cancellation and the connection limit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvloop

from kvgate.gateway.replicas.replica_errors import (
    ReplicaConnectError,
    ReplicaDisconnected,
    ReplicaProtocolError,
    ReplicaTimeout,
)
from kvgate.gateway.replicas.replica_http import ReplicaClient
from tests.integration.conftest import eventually

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
HEADERS = [(b"content-type", b"application/json"), (b"x-request-id", b"abc")]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Callable[[], Coroutine[Any, Any, None]]], None]:
    def runner(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
        if request.param == "uvloop":
            uvloop.run(main())
        else:
            asyncio.run(main())

    return runner


@dataclass
class Server:
    url: str
    connections: int = 0
    closed: int = 0
    requests: list[bytes] = field(default_factory=list)


@asynccontextmanager
async def serving(
    handler: Callable[[Server, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> AsyncIterator[Server]:
    server = Server(url="")

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server.connections += 1
        try:
            await handler(server, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            server.closed += 1
            writer.close()

    listener = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    server.url = f"http://127.0.0.1:{port}"
    async with listener:
        yield server


async def read_request(server: Server, reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    request = head + await reader.readexactly(length)
    server.requests.append(request)
    return request


def json_response(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (
        len(body),
        extra,
        body,
    )


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def client(**overrides: Any) -> ReplicaClient:
    settings: dict[str, Any] = {
        "connect_s": 2.0,
        "first_byte_s": 5.0,
        "idle_s": 5.0,
        "keepalive_s": 30.0,
        "limit": 100,
    }
    settings.update(overrides)
    return ReplicaClient(**settings)


async def keep_answering(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        await read_request(server, reader)
        writer.write(json_response(b'{"ok":true}'))
        await writer.drain()


def test_a_connection_is_reused_and_the_request_goes_out_as_given(run: Any) -> None:
    async def main() -> None:
        async with serving(keep_answering) as server:
            replicas = client()
            for _ in range(3):
                response = await replicas.post(
                    server.url + "/base", "/v1/completions", b'{"a":1}', HEADERS, stream=False
                )
                assert response.status == 200
                assert response.header(b"content-type") == b"application/json"
                assert await response.read() == b'{"ok":true}'
                response.release()
            assert server.connections == 1
            assert replicas.open_connections == 1
            head, _, body = server.requests[0].partition(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            assert lines[0] == b"POST /base/v1/completions HTTP/1.1"
            port = server.url.rsplit(":", 1)[1].encode()
            assert set(lines[1:]) == {
                b"host: 127.0.0.1:" + port,
                b"content-length: 7",
                b"content-type: application/json",
                b"x-request-id: abc",
            }
            assert body == b'{"a":1}'
            await replicas.close()

    run(main)


def test_a_chunked_stream_arrives_in_order_and_its_connection_goes_back_to_the_pool(run: Any) -> None:
    events = [b"data: %d\n\n" % i for i in range(20)]

    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(server, reader)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            for event in events:
                writer.write(chunk(event))
                await writer.drain()
                await asyncio.sleep(0.001)
            writer.write(b"0\r\n\r\n")

    async def main() -> None:
        async with serving(handler) as server:
            replicas = client()
            for _ in range(2):
                response = await replicas.post(server.url, "/v1/completions", b"{}", HEADERS, stream=True)
                received = bytearray()
                while piece := await response.read_chunk():
                    received += piece
                assert bytes(received) == b"".join(events)
                assert await response.read_chunk() == b""
                response.release()
            assert server.connections == 1
            await replicas.close()

    run(main)


def test_a_body_that_ends_with_the_connection_is_whole_and_the_connection_is_not_reused(run: Any) -> None:
    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(server, reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
        await writer.drain()

    async def main() -> None:
        async with serving(handler) as server:
            replicas = client()
            response = await replicas.post(server.url, "/v1/completions", b"{}", HEADERS, stream=False)
            assert await response.read() == b"all of it"
            response.release()
            await asyncio.sleep(0.05)
            assert replicas.open_connections == 0
            await replicas.close()

    run(main)


def test_a_pooled_connection_the_replica_closed_is_replaced_without_an_error(run: Any) -> None:
    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # answers one request as if it kept the connection alive, then drops the connection when
        # the next one arrives, unanswered (its keep-alive timeout racing the next request)
        await read_request(server, reader)
        writer.write(json_response(b"{}"))
        await writer.drain()
        await read_request(server, reader)

    async def main() -> None:
        async with serving(handler) as server:
            replicas = client()
            for _ in range(3):
                response = await replicas.post(server.url, "/v1/completions", b"{}", HEADERS, stream=False)
                assert await response.read() == b"{}"
                response.release()
            # the 2nd and 3rd requests each met a dropped connection first and went again on a new one
            assert server.connections == 3
            assert len(server.requests) == 5
            await replicas.close()

    run(main)


def test_a_replica_dying_mid_response_is_an_error_and_its_connection_is_dropped(run: Any) -> None:
    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(server, reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunk(b"data: 1\n\n"))
        await writer.drain()
        await asyncio.sleep(0.05)

    async def main() -> None:
        async with serving(handler) as server:
            replicas = client()
            response = await replicas.post(server.url, "/v1/completions", b"{}", HEADERS, stream=True)
            assert await response.read_chunk() == b"data: 1\n\n"
            with pytest.raises(ReplicaDisconnected):
                await response.read_chunk()
            response.release()
            assert replicas.open_connections == 0
            await replicas.close()

    run(main)


def test_nothing_listening_is_a_connect_error(run: Any) -> None:
    async def main() -> None:
        async with serving(keep_answering) as server:
            url = server.url
        replicas = client()
        with pytest.raises(ReplicaConnectError) as raised:
            await replicas.post(url, "/v1/completions", b"{}", HEADERS, stream=False)
        assert isinstance(raised.value.os_error, ConnectionRefusedError)
        assert replicas.open_connections == 0
        await replicas.close()

    run(main)


def test_no_answer_within_first_byte_s_times_out_and_closes_the_connection(run: Any) -> None:
    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(server, reader)
        await reader.read()  # until the client closes

    async def main() -> None:
        async with serving(handler) as server:
            replicas = client(first_byte_s=0.2)
            with pytest.raises(ReplicaTimeout):
                await replicas.post(server.url, "/v1/completions", b"{}", HEADERS, stream=False)
            assert await eventually(lambda: server.closed == 1)
            assert replicas.open_connections == 0
            await replicas.close()

    run(main)


def test_a_stream_silent_for_idle_s_times_out_after_its_first_chunk(run: Any) -> None:
    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(server, reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunk(b"data: 1\n\n"))
        await writer.drain()
        await reader.read()

    async def main() -> None:
        async with serving(handler) as server:
            # the first byte may take 5 s, but once the stream has started 0.2 s of silence ends it
            replicas = client(first_byte_s=5.0, idle_s=0.2)
            response = await replicas.post(server.url, "/v1/completions", b"{}", HEADERS, stream=True)
            assert await response.read_chunk() == b"data: 1\n\n"
            with pytest.raises(ReplicaTimeout):
                await response.read_chunk()
            response.release()
            await replicas.close()

    run(main)


def test_a_reader_that_falls_behind_pauses_the_replica_and_loses_nothing(run: Any) -> None:
    payload = bytes(range(256)) * 16 * 1024  # 4 MiB

    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(server, reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for start in range(0, len(payload), 64 * 1024):
            writer.write(chunk(payload[start : start + 64 * 1024]))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def main() -> None:
        async with serving(handler) as server:
            replicas = client(idle_s=0.2)
            response = await replicas.post(server.url, "/v1/completions", b"{}", HEADERS, stream=True)
            await asyncio.sleep(0.5)  # longer than idle_s: a paused reader is not an idle replica
            received = bytearray()
            largest = 0
            while piece := await response.read_chunk():
                largest = max(largest, len(piece))
                received += piece
            assert bytes(received) == payload
            assert largest < len(payload) // 4, "reading stopped while nobody consumed"
            response.release()
            await replicas.close()

    run(main)


def test_cancelling_a_request_closes_its_connection(run: Any) -> None:
    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(server, reader)
        await reader.read()

    async def main() -> None:
        async with serving(handler) as server:
            replicas = client()
            task = asyncio.create_task(
                replicas.post(server.url, "/v1/completions", b"{}", HEADERS, stream=False)
            )
            while not server.requests:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await eventually(lambda: server.closed == 1)
            assert replicas.open_connections == 0
            await replicas.close()

    run(main)


def test_at_the_connection_limit_a_request_waits_for_a_released_connection(run: Any) -> None:
    async def main() -> None:
        async with serving(keep_answering) as server:
            replicas = client(limit=1)

            async def one() -> bytes:
                response = await replicas.post(server.url, "/v1/completions", b"{}", HEADERS, stream=False)
                try:
                    return await response.read()
                finally:
                    response.release()

            assert await asyncio.gather(*(one() for _ in range(5))) == [b'{"ok":true}'] * 5
            assert server.connections == 1
            await replicas.close()

    run(main)


def test_an_answer_that_is_not_http_is_a_protocol_error(run: Any) -> None:
    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(server, reader)
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await writer.drain()
        await reader.read()

    async def main() -> None:
        async with serving(handler) as server:
            replicas = client()
            with pytest.raises(ReplicaProtocolError):
                await replicas.post(server.url, "/v1/completions", b"{}", HEADERS, stream=False)
            assert replicas.open_connections == 0
            await replicas.close()

    run(main)


def test_a_response_left_unread_while_reading_was_stopped_is_not_pooled(run: Any) -> None:
    big = b"x" * (400 * 1024)  # above the high-water mark, small enough to arrive whole

    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            request = await read_request(server, reader)
            writer.write(json_response(big if b"big" in request else b"{}"))
            await writer.drain()

    async def main() -> None:
        async with serving(handler) as server:
            replicas = client(first_byte_s=2.0)
            abandoned = await replicas.post(server.url, "/v1/completions", b"big", HEADERS, stream=True)
            await asyncio.sleep(0.2)  # the whole body arrives; reading stopped above the high-water mark
            abandoned.release()
            response = await replicas.post(server.url, "/v1/completions", b"{}", HEADERS, stream=False)
            assert await response.read() == b"{}"
            response.release()
            assert server.connections == 2
            await replicas.close()

    run(main)


def test_a_whole_body_larger_than_the_high_water_mark_is_read_to_its_end(run: Any) -> None:
    body = b'{"text":"' + b"x" * (3 * 1024 * 1024) + b'"}'

    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(server, reader)
        writer.write(json_response(body))
        await writer.drain()
        await reader.read()

    async def main() -> None:
        async with serving(handler) as server:
            replicas = client(first_byte_s=2.0)
            response = await replicas.post(server.url, "/v1/completions", b"{}", HEADERS, stream=False)
            assert await response.read() == body
            response.release()
            assert replicas.open_connections == 1, "read to its end, the connection goes back to the pool"
            await replicas.close()

    run(main)


def test_a_body_is_taken_whole_without_waiting_only_once_all_of_it_arrived(run: Any) -> None:
    release_rest = asyncio.Event()

    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(server, reader)
        whole = json_response(b'{"ok":true}')
        writer.write(whole[:-4])
        await writer.drain()
        await release_rest.wait()
        writer.write(whole[-4:])
        await writer.drain()
        await read_request(server, reader)
        writer.write(json_response(b'{"two":2}'))
        await writer.drain()
        await reader.read()

    async def main() -> None:
        async with serving(handler) as server:
            replicas = client()
            response = await replicas.post(server.url, "/v1/completions", b"{}", HEADERS, stream=False)
            assert response.body_now() is None
            release_rest.set()
            assert await response.read() == b'{"ok":true}'
            response.release()
            response = await replicas.post(server.url, "/v1/completions", b"{}", HEADERS, stream=False)
            body = response.body_now()
            for _ in range(500):
                if body is not None:
                    break
                await asyncio.sleep(0.01)
                body = response.body_now()
            assert body == b'{"two":2}'
            assert response.body_now() == b""
            response.release()
            assert server.connections == 1
            await replicas.close()

    run(main)
