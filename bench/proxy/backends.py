"""The proxy benchmark's zero-delay backends: every POST answered at once, one process for all ports.

HTTP/1.1 keep-alive on raw asyncio + httptools (``bench.harness.raw_http``), so the backends' own CPU
per request stays small beside the gateway's. A request is answered with JSON, or with
``max_tokens`` SSE chunks written back to back, or paced ``x-bench-pace-ms`` apart (the header, or
``bench-pace-ms:N`` as the last message, which every router forwards). ``GET /health`` is 200.

    python -m bench.proxy.backends PORT[,PORT...]
"""

from __future__ import annotations

import asyncio
import sys

import orjson

from bench.harness.raw_http import RequestProtocol
from bench.proxy.stage import CHUNKS, MODEL, PACE_HEADER, PACE_PROMPT_PREFIX


class _BackendProtocol(RequestProtocol):
    """HTTP/1.1 keep-alive server answering every POST at once: JSON, or ``max_tokens`` SSE chunks."""

    __slots__ = ("_pace_ms",)

    def __init__(self) -> None:
        super().__init__()
        self._pace_ms = 0.0

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._pace_ms = 0.0

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == PACE_HEADER.encode():
            self._pace_ms = float(value)

    def on_message_complete(self) -> None:
        assert self._transport is not None
        if self._url == b"/health":
            self._transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok"
            )
            return
        request = orjson.loads(bytes(self._body))
        chunks = int(request.get("max_tokens") or request.get("max_completion_tokens") or CHUNKS)
        content = request.get("messages", [{}])[-1].get("content")
        if isinstance(content, str) and content.startswith(PACE_PROMPT_PREFIX):
            self._pace_ms = float(content.removeprefix(PACE_PROMPT_PREFIX))
        if not request.get("stream"):
            body = orjson.dumps(
                {
                    "id": "cmpl-bench",
                    "object": "chat.completion",
                    "model": MODEL,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "x" * chunks}}],
                    "usage": {"prompt_tokens": 8, "completion_tokens": chunks, "total_tokens": 8 + chunks},
                }
            )
            head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(
                body
            )
            self._transport.write(head + body)
            return
        self._transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        asyncio.get_running_loop().create_task(self._stream(chunks, self._pace_ms))

    async def _stream(self, chunks: int, pace_ms: float) -> None:
        assert self._transport is not None
        event = (
            b'data: {"id":"cmpl-bench","object":"chat.completion.chunk",'
            b'"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
        )
        frame = b"%x\r\n%s\r\n" % (len(event), event)
        for _ in range(chunks):
            if self._transport.is_closing():
                return
            self._transport.write(frame)
            if pace_ms:
                await asyncio.sleep(pace_ms / 1000)
        done = b"data: [DONE]\n\n"
        self._transport.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))


async def serve_backends(ports: list[int]) -> None:
    loop = asyncio.get_running_loop()
    servers = [await loop.create_server(_BackendProtocol, "127.0.0.1", port) for port in ports]
    print("ready", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


def main(argv: list[str] | None = None) -> int:
    import uvloop

    args = sys.argv[1:] if argv is None else argv
    uvloop.run(serve_backends([int(port) for port in args[0].split(",")]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
