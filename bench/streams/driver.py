"""One driver process of the open streams benchmark: opens its share of streams and holds them.

Raw asyncio protocols on uvloop, one connection per stream, no HTTP client library, so that
thousands of open streams cost the driver little beside the gateway it measures. Streams are
opened at a fixed rate from an agreed moment (``CLOCK_MONOTONIC``, shared by every process on
the machine). A stream counts its tokens (``data: {`` events) and the gap between two reads
that carried tokens (at one token a chunk, paced far apart, one read is one token); gaps and
tokens that land inside the measuring window are kept. An error is a status other than 200, an
``error`` event, or a connection that ends before ``[DONE]``.

It prints a progress line (``progress OPENED DONE TOKENS ERRORS``) every second and, at the end,
writes its counts and the window's gaps as JSON to the file named by its second argument (too
large for a pipe the event loop has left non-blocking) and prints ``result``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from array import array
from dataclasses import dataclass, field
from typing import cast

import orjson

_STATUS_OK = b"HTTP/1.1 200"
_TOKEN = b"data: {"
_DONE = b"data: [DONE]"
_ERROR = b'"error"'


@dataclass(frozen=True, slots=True)
class DriverPlan:
    host: str
    ports: tuple[int, ...]
    """Stream ``i`` goes to ``ports[i % len(ports)]``."""
    path: str
    streams: int
    open_per_s: float
    start_s: float
    """When the first stream opens, on ``time.monotonic()``."""
    window_start_s: float
    window_end_s: float
    tokens: int
    itl_ms: float

    def request(self, port: int) -> bytes:
        body = orjson.dumps(
            {
                "model": "bench-model",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": self.tokens,
                "ignore_eos": True,
                "stream": True,
            }
        )
        head = (
            f"POST {self.path} HTTP/1.1\r\nhost: {self.host}:{port}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"x-bench-itl-ms: {self.itl_ms:g}\r\n\r\n"
        )
        return head.encode() + body


@dataclass(slots=True)
class Tally:
    opened: int = 0
    done: int = 0
    tokens: int = 0
    errors: int = 0
    window_tokens: int = 0
    gaps_s: array[float] = field(default_factory=lambda: array("d"))
    first_error: str = ""

    def error(self, what: str) -> None:
        self.errors += 1
        self.first_error = self.first_error or what


class _Stream(asyncio.Protocol):
    __slots__ = ("_ended", "_finished", "_head", "_last_s", "_plan", "_request", "_tally", "_transport")

    def __init__(
        self, plan: DriverPlan, request: bytes, tally: Tally, finished: asyncio.Future[None]
    ) -> None:
        self._plan = plan
        self._request = request
        self._tally = tally
        self._finished = finished
        self._transport: asyncio.Transport | None = None
        self._head = True
        self._ended = False
        self._last_s = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        tally = self._tally
        if self._head:
            self._head = False
            if not data.startswith(_STATUS_OK):
                self._end(data[:80].decode(errors="replace"))
                return
        tokens = data.count(_TOKEN)
        if tokens:
            now_s = time.monotonic()
            tally.tokens += tokens
            plan = self._plan
            if plan.window_start_s <= now_s < plan.window_end_s:
                tally.window_tokens += tokens
                if self._last_s:
                    tally.gaps_s.append(now_s - self._last_s)
            self._last_s = now_s
        if _ERROR in data:
            self._end("error event: " + data[-200:].decode(errors="replace"))
        elif _DONE in data:
            self._end("")

    def _end(self, error: str) -> None:
        if self._ended:
            return
        self._ended = True
        if error:
            self._tally.error(error)
        else:
            self._tally.done += 1
        assert self._transport is not None
        self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._ended:
            self._ended = True
            self._tally.error(f"connection lost before [DONE]: {exc!r}")
        if not self._finished.done():
            self._finished.set_result(None)


async def drive(plan: DriverPlan) -> Tally:
    loop = asyncio.get_running_loop()
    tally = Tally()
    requests = [plan.request(port) for port in plan.ports]
    finished: list[asyncio.Future[None]] = []
    progress = loop.create_task(_report_progress(tally))

    async def open_one(i: int) -> None:
        done: asyncio.Future[None] = loop.create_future()
        finished.append(done)
        port = plan.ports[i % len(plan.ports)]
        request = requests[i % len(plan.ports)]
        try:
            await loop.create_connection(lambda: _Stream(plan, request, tally, done), plan.host, port)
        except OSError as exc:
            tally.error(f"connect: {exc!r}")
            done.set_result(None)

    openings = []
    for i in range(plan.streams):
        delay_s = plan.start_s + i / plan.open_per_s - time.monotonic()
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        openings.append(loop.create_task(open_one(i)))
        tally.opened += 1
    await asyncio.gather(*openings)
    await asyncio.gather(*finished)
    progress.cancel()
    return tally


async def _report_progress(tally: Tally) -> None:
    while True:
        print(f"progress {tally.opened} {tally.done} {tally.tokens} {tally.errors}", flush=True)
        await asyncio.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    import resource

    import uvloop

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    args = sys.argv[1:] if argv is None else argv
    fields = orjson.loads(args[0])
    plan = DriverPlan(**(fields | {"ports": tuple(fields["ports"])}))
    tally = uvloop.run(drive(plan))
    result = {
        "opened": tally.opened,
        "done": tally.done,
        "tokens": tally.tokens,
        "errors": tally.errors,
        "first_error": tally.first_error,
        "window_tokens": tally.window_tokens,
        "gaps_s": tally.gaps_s.tolist(),
    }
    with open(args[1], "wb") as out:
        out.write(orjson.dumps(result))
    print("result", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
