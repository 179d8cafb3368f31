"""The chaos benchmark's well-formed clients: one completion each, and how it ended.

``StreamClient`` sends one completion over aiohttp and classifies how it ended: a complete answer,
an OpenAI-shaped error, a stream that ended with an error event and ``[DONE]``, left by the client
on purpose, or *lost* (a reset, an incomplete stream, a body that is no OpenAI error): the one
outcome a gateway must never produce.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DONE = b"data: [DONE]\n\n"

COMPLETE = "complete"
ERROR_ANSWER = "openai_error"
STREAM_ERROR = "stream_error_event"
LEFT = "left_by_client"
LOST = "lost"


def completion_body(max_tokens: int, prompt_words: int = 40, stream: bool = True, **extra: Any) -> bytes:
    prompt = " ".join(f"w{i}" for i in range(prompt_words))
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": stream, "ignore_eos": True}
    return orjson.dumps({**body, **extra})


def is_openai_error(body: bytes) -> bool:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    error = parsed.get("error") if isinstance(parsed, dict) else None
    return isinstance(error, dict) and {"message", "type", "param", "code"} <= set(error)


@dataclass(slots=True)
class Outcome:
    kind: str = LOST
    status: int | None = None
    detail: str = ""
    headers_at_s: float | None = None
    first_chunk_at_s: float | None = None


@dataclass(slots=True)
class StreamClient:
    """One request; ``leave`` set means "hang up now" (from wherever the request is)."""

    url: str
    body: bytes
    leave: asyncio.Event = field(default_factory=asyncio.Event)
    outcome: Outcome = field(default_factory=Outcome)

    async def run(self, session: aiohttp.ClientSession) -> Outcome:
        task = asyncio.ensure_future(self._exchange(session))
        leave = asyncio.ensure_future(self.leave.wait())
        await asyncio.wait({task, leave}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self.outcome.kind = LEFT
        leave.cancel()
        return self.outcome

    async def _exchange(self, session: aiohttp.ClientSession) -> None:
        outcome = self.outcome
        start = time.monotonic()
        try:
            headers = {"content-type": "application/json"}
            async with session.post(self.url, data=self.body, headers=headers) as response:
                outcome.status = response.status
                outcome.headers_at_s = time.monotonic() - start
                if response.status != 200:
                    body = await response.read()
                    ok = is_openai_error(body)
                    outcome.kind = ERROR_ANSWER if ok else LOST
                    outcome.detail = body[:200].decode(errors="replace")
                    return
                if not response.content_type.startswith("text/event-stream"):
                    answer = await response.read()
                    outcome.first_chunk_at_s = time.monotonic() - start
                    whole = b'"choices"' in answer and answer.rstrip().endswith(b"}")
                    outcome.kind = COMPLETE if whole else LOST
                    outcome.detail = "" if whole else f"incomplete JSON answer: {answer[-120:]!r}"
                    return
                tail = b""
                async for chunk in response.content.iter_any():
                    if outcome.first_chunk_at_s is None:
                        outcome.first_chunk_at_s = time.monotonic() - start
                    tail = (tail + chunk)[-4096:]
                self._classify_stream(tail)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            outcome.kind = LOST
            outcome.detail = f"{type(exc).__name__}: {exc}"[:200]

    def _classify_stream(self, tail: bytes) -> None:
        outcome = self.outcome
        if not tail.endswith(DONE):
            outcome.kind, outcome.detail = LOST, f"stream ended without [DONE]: {tail[-120:]!r}"
            return
        last = tail[: -len(DONE)].rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
        if last.startswith(b"data: ") and is_openai_error(last[6:]):
            outcome.kind, outcome.detail = STREAM_ERROR, last[6:200].decode(errors="replace")
            return
        outcome.kind = COMPLETE
