"""One streamed request, timed the way a user feels it, with the official SDK's retry manners.

The client sends a prepared body over a shared ``aiohttp`` session, parses the SSE stream line by
line and records when the first content token arrived (TTFT, measured from the first attempt, so
time spent waiting out a 429 counts against the user), the gap before every later content chunk
(ITL), the end-to-end time and the token counts the server reports in its final ``usage`` chunk.
With a ``RetryPolicy`` it behaves like the OpenAI SDK: on 408/409/429/5xx or a broken connection
it waits ``retry-after-ms``, else ``retry-after`` (seconds or an HTTP date) when that is in
(0, 60] seconds, else an exponential back-off with jitter, and it never waits past the request's
deadline or beyond its retry budget. aiohttp is used for its low CPU per request: the generator
must not be the bottleneck it measures.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp
import orjson

RETRYABLE_STATUSES = frozenset({408, 409, 429})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_retries: int = 2
    max_header_wait_s: float = 60.0
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 8.0


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What one request did. Offsets (``*_at_s``) are seconds from the start of the run."""

    index: int
    class_name: str
    scheduled_at_s: float | None
    sent_at_s: float
    status: int
    error: str | None
    ttft_s: float | None
    itl_s: tuple[float, ...]
    e2e_s: float
    prompt_tokens: int
    completion_tokens: int
    retries: int
    wait_honoured_s: float

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    @property
    def rejected(self) -> bool:
        return self.status == 429

    @property
    def lag_s(self) -> float | None:
        return None if self.scheduled_at_s is None else self.sent_at_s - self.scheduled_at_s

    @property
    def mean_itl_s(self) -> float | None:
        return sum(self.itl_s) / len(self.itl_s) if self.itl_s else None

    def meets_slo(self, ttft_s: float, itl_s: float) -> bool:
        """Goodput: a successful request whose TTFT and mean inter-token gap are both within target."""
        mean_itl_s = self.mean_itl_s
        return (
            self.ok
            and self.ttft_s is not None
            and self.ttft_s <= ttft_s
            and (mean_itl_s is None or mean_itl_s <= itl_s)
        )


def parse_retry_after_s(headers: Mapping[str, str], now_epoch_s: float) -> float | None:
    """Seconds the server asked us to wait: ``retry-after-ms``, then ``retry-after`` as seconds or an
    HTTP date; ``None`` when neither header is present and parseable."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return float(millis) / 1000.0
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    parsed = email.utils.parsedate_tz(value)
    if parsed is None:
        return None
    return float(email.utils.mktime_tz(parsed)) - now_epoch_s


def retry_wait_s(
    policy: RetryPolicy, retries_done: int, header_wait_s: float | None, rng: random.Random
) -> float:
    """The server's wait when it is in (0, max_header_wait_s]; otherwise back-off with 25% jitter."""
    if header_wait_s is not None and 0 < header_wait_s <= policy.max_header_wait_s:
        return header_wait_s
    backoff_s = min(policy.initial_backoff_s * 2.0**retries_done, policy.max_backoff_s)
    return backoff_s * (1.0 - 0.25 * rng.random())


def should_retry(status: int, headers: Mapping[str, str]) -> bool:
    should = headers.get("x-should-retry")
    if should == "true":
        return True
    if should == "false":
        return False
    return status in RETRYABLE_STATUSES or status >= 500


@dataclass(slots=True)
class _Attempt:
    status: int = 0
    error: str | None = None
    headers: Mapping[str, str] | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    chunks: int = 0


class Client:
    """Sends trace requests to one OpenAI-compatible base URL (without ``/v1``)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        retry: RetryPolicy | None = None,
        rng: random.Random | None = None,
        origin_s: float | None = None,
    ) -> None:
        self._session = session
        self._base_url = base_url.rstrip("/")
        self._retry = retry
        self._rng = rng or random.Random(0)
        self.origin_s = time.perf_counter() if origin_s is None else origin_s

    async def send(
        self,
        path: str,
        body: bytes,
        *,
        index: int = 0,
        class_name: str = "",
        scheduled_at_s: float | None = None,
        timeout_s: float = 600.0,
    ) -> RequestRecord:
        start_s = time.perf_counter()
        deadline_s = start_s + timeout_s
        retries = 0
        waited_s = 0.0
        itl_s: list[float] = []
        while True:
            itl_s.clear()
            attempt = await self._attempt(path, body, deadline_s, itl_s, retries)
            if attempt.status == 200 and attempt.error is None:
                break
            headers = attempt.headers or {}
            retryable = attempt.status == 0 or should_retry(attempt.status, headers)
            if self._retry is None or not retryable or retries >= self._retry.max_retries:
                break
            header_wait_s = parse_retry_after_s(headers, time.time())
            wait_s = retry_wait_s(self._retry, retries, header_wait_s, self._rng)
            if time.perf_counter() + wait_s >= deadline_s:
                break
            await asyncio.sleep(wait_s)
            waited_s += wait_s
            retries += 1
        end_s = time.perf_counter()
        return RequestRecord(
            index=index,
            class_name=class_name,
            scheduled_at_s=scheduled_at_s,
            sent_at_s=start_s - self.origin_s,
            status=attempt.status,
            error=attempt.error,
            ttft_s=None if attempt.first_token_s is None else attempt.first_token_s - start_s,
            itl_s=tuple(itl_s),
            e2e_s=end_s - start_s,
            prompt_tokens=attempt.prompt_tokens,
            completion_tokens=attempt.completion_tokens or attempt.chunks,
            retries=retries,
            wait_honoured_s=waited_s,
        )

    async def _attempt(
        self, path: str, body: bytes, deadline_s: float, itl_s: list[float], retries: int
    ) -> _Attempt:
        """One try; like the official SDKs it says which (``x-stainless-retry-count``), which is how
        kvgate knows a returning request from a new one with the same body."""
        attempt = _Attempt()
        remaining_s = max(deadline_s - time.perf_counter(), 0.001)
        try:
            async with self._session.post(
                self._base_url + path,
                data=body,
                headers={
                    "content-type": "application/json",
                    "accept": "text/event-stream",
                    "x-stainless-retry-count": str(retries),
                },
                timeout=aiohttp.ClientTimeout(total=remaining_s),
            ) as response:
                attempt.status = response.status
                attempt.headers = response.headers
                if response.status != 200:
                    attempt.error = _error_message(await response.read())
                    return attempt
                await self._read_stream(response, attempt, itl_s)
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
            attempt.error = f"{type(exc).__name__}: {exc}"[:200]
            if attempt.status == 200 and attempt.first_token_s is None:
                attempt.status = 0
        return attempt

    async def _read_stream(
        self, response: aiohttp.ClientResponse, attempt: _Attempt, itl_s: list[float]
    ) -> None:
        """Events are split out of whatever each network read delivered; events that arrived in the
        same read share its arrival time."""
        pending = b""
        async for chunk in response.content.iter_any():
            now_s = time.perf_counter()
            pending += chunk.replace(b"\r\n", b"\n") if b"\r" in chunk else chunk
            *events, pending = pending.split(b"\n\n")
            for event in events:
                for line in event.split(b"\n"):
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        return
                    self._on_event(orjson.loads(data), attempt, itl_s, now_s)

    @staticmethod
    def _on_event(event: Mapping[str, object], attempt: _Attempt, itl_s: list[float], now_s: float) -> None:
        if "error" in event:
            attempt.error = _error_message(orjson.dumps(event))
            return
        choices = event.get("choices")
        if isinstance(choices, list) and choices:
            choice = choices[0]
            delta = choice.get("delta") if isinstance(choice, dict) else None
            text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if text:
                if attempt.last_token_s is None:
                    attempt.first_token_s = now_s
                else:
                    itl_s.append(now_s - attempt.last_token_s)
                attempt.last_token_s = now_s
                attempt.chunks += 1
        usage = event.get("usage")
        if isinstance(usage, dict):
            attempt.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            attempt.completion_tokens = int(usage.get("completion_tokens") or 0)


def _error_message(raw: bytes) -> str:
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw[:200].decode(errors="replace") or "empty body"
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict):
        return str(error.get("message", error))[:200]
    return str(payload)[:200]


async def wait_until_ok(session: aiohttp.ClientSession, url: str, timeout_s: float = 60.0) -> None:
    """Poll ``GET url`` until it answers 200 (a replica's ``/health``, the gateway's ``/readyz``);
    ``RuntimeError`` when it has not within ``timeout_s``. A process just started refuses
    connections at first, so connection errors count as "not yet"."""
    deadline_s = time.monotonic() + timeout_s
    while True:
        try:
            async with session.get(url) as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        if time.monotonic() > deadline_s:
            raise RuntimeError(f"{url} did not answer 200 within {timeout_s:g} s")
        await asyncio.sleep(0.05)
