"""Backends that hold thousands of token streams for almost no CPU: raw asyncio + httptools.

Every POST is answered with an SSE stream of ``max_tokens`` vLLM-shaped chunks, one every
``x-bench-itl-ms`` milliseconds (header; 0: back to back), on a schedule fixed at the request's
arrival (``loop.call_at``), so a late tick does not push the later ones back. Then a chunk with
``finish_reason``, the usage chunk when ``stream_options.include_usage`` asks for it (as the gateway
does) and ``[DONE]``. ``GET /health`` is 200; any other GET is 404. One timer per stream and token
and no task, no coroutine: the simulator's engine model would cost more per token than the gateway
being measured.

    python -m bench.streams.backend PORT[,PORT...]
"""

from __future__ import annotations

import asyncio
import sys

import orjson

from bench.harness.raw_http import RequestProtocol

ITL_HEADER = b"x-bench-itl-ms"
_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
)
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"
_HEALTHY = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok"


def _frame(event: bytes) -> bytes:
    """``event`` as one HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(event), event)


def _event(payload: dict[str, object]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


_CHUNK_ID = "chatcmpl-0123456789abcdef0123456789abcdef"
_TOKEN = _frame(
    _event(
        {
            "id": _CHUNK_ID,
            "object": "chat.completion.chunk",
            "created": 1767225600,
            "model": "bench-model",
            "choices": [
                {"index": 0, "delta": {"content": " token"}, "logprobs": None, "finish_reason": None}
            ],
        }
    )
)
"""One token as vLLM streams it (about 200 bytes with its SSE framing)."""
_FINISH = _frame(
    _event(
        {
            "id": _CHUNK_ID,
            "object": "chat.completion.chunk",
            "created": 1767225600,
            "model": "bench-model",
            "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}],
        }
    )
)
_DONE = _frame(b"data: [DONE]\n\n") + b"0\r\n\r\n"


def _usage(prompt_tokens: int, completion_tokens: int) -> bytes:
    return _frame(
        _event(
            {
                "id": _CHUNK_ID,
                "object": "chat.completion.chunk",
                "created": 1767225600,
                "model": "bench-model",
                "choices": [],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            }
        )
    )


class PacedBackend(RequestProtocol):
    """One keep-alive connection; one stream at a time on it, as HTTP/1.1 clients use them."""

    __slots__ = ("_itl_s", "_left", "_loop", "_next_s", "_usage")

    def __init__(self) -> None:
        super().__init__()
        self._loop = asyncio.get_running_loop()
        self._itl_s = 0.0
        self._left = 0
        self._next_s = 0.0
        self._usage = b""

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._itl_s = 0.0

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == ITL_HEADER:
            self._itl_s = float(value) / 1000

    def on_message_complete(self) -> None:
        transport = self._transport
        assert transport is not None
        if self._parser.get_method() != b"POST":
            transport.write(_HEALTHY if self._url == b"/health" else _NOT_FOUND)
            return
        request = orjson.loads(bytes(self._body))
        self._left = int(request.get("max_tokens", 16))
        options = request.get("stream_options") or {}
        self._usage = _usage(8, self._left) if options.get("include_usage") else b""
        transport.write(_HEAD)
        self._next_s = self._loop.time()
        self._tick()

    def _tick(self) -> None:
        transport = self._transport
        assert transport is not None
        if transport.is_closing():
            return
        if self._left <= 0:
            transport.write(_FINISH + self._usage + _DONE)
            return
        self._left -= 1
        transport.write(_TOKEN)
        if self._itl_s:
            self._next_s += self._itl_s
            self._loop.call_at(self._next_s, self._tick)
        else:
            self._loop.call_soon(self._tick)


async def serve(ports: list[int]) -> None:
    loop = asyncio.get_running_loop()
    servers = [await loop.create_server(PacedBackend, "127.0.0.1", port, backlog=4096) for port in ports]
    print("ready", flush=True)
    await asyncio.gather(*(server.serve_forever() for server in servers))


def main(argv: list[str] | None = None) -> int:
    import uvloop

    args = sys.argv[1:] if argv is None else argv
    uvloop.run(serve([int(port) for port in args[0].split(",")]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
