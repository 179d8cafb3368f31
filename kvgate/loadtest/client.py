"""One streamed request, timed the way a user feels it, with the official SDK's retry manners.

The client sends a prepared body over a shared ``aiohttp`` session, parses the SSE stream line by
line and records when the first content token arrived (TTFT, measured from the first attempt, so
time spent waiting out a 429 counts against the user), the gap before every later content chunk
(ITL), the end-to-end time and the token counts the server reports in its final ``usage`` chunk.

With a ``RetryPolicy`` it retries as openai-python does (``openai/_base_client.py`` and
``openai/_constants.py`` of the installed release, 3.63): at most ``max_retries`` times
(``DEFAULT_MAX_RETRIES = 2``), each attempt saying how many came before (``x-stainless-retry-count``).
Whether to retry (``_should_retry``): never when the server's wait is finite and longer than the
ceiling (``MAX_RETRY_AFTER_DELAY = 2 * 60``); else as ``x-should-retry: true`` / ``false`` says;
else on 408, 409, 429 and 5xx; a broken connection or a timeout always. How long to wait
(``_calculate_retry_timeout``): the server's wait when it is finite and in (0, ceiling]: read from
``retry-after-ms``, else ``retry-after`` as seconds (``_parse_retry_after_header``: a value that is
not a number is skipped, an overflowing one counts as past the ceiling), else ``retry-after`` as an
HTTP date; otherwise ``min(INITIAL_RETRY_DELAY * 2 ** retries_taken, MAX_RETRY_DELAY)`` (0.5 s and
8 s) less a random 0-25 % jitter. Releases before the 120 s ceiling (``MAX_RETRY_AFTER_DELAY = 60``)
backed off instead of giving up past it: ``RetryPolicy.legacy()``. One difference, for a bounded
run: a retry that would wait past the request's ``timeout_s`` (counted from its first attempt) is
not made. aiohttp is used for its low CPU per request: the generator must not be the bottleneck it
measures.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp
import orjson

RETRYABLE_STATUSES = frozenset({408, 409, 429})


SDK_MAX_RETRIES = 2
"""openai-python's ``DEFAULT_MAX_RETRIES``."""
SDK_RETRY_AFTER_CEILING_S = 120.0
"""openai-python's ``MAX_RETRY_AFTER_DELAY`` (``2 * 60``; 60 in releases before the change)."""
SDK_INITIAL_RETRY_DELAY_S = 0.5
SDK_MAX_RETRY_DELAY_S = 8.0
_INFINITIES = frozenset({"inf", "+inf", "infinity", "+infinity"})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_retries: int = SDK_MAX_RETRIES
    max_header_wait_s: float = SDK_RETRY_AFTER_CEILING_S
    """The longest server wait honoured (``MAX_RETRY_AFTER_DELAY``)."""
    initial_backoff_s: float = SDK_INITIAL_RETRY_DELAY_S
    max_backoff_s: float = SDK_MAX_RETRY_DELAY_S
    give_up_past_ceiling: bool = True
    """Past ``max_header_wait_s`` the current SDK does not retry; older ones backed off instead."""

    @classmethod
    def legacy(cls, max_retries: int = SDK_MAX_RETRIES) -> RetryPolicy:
        """openai-python before the 120 s ceiling: a server wait above 60 s is ignored and the
        client backs off for at most 8 s."""
        return cls(max_retries, max_header_wait_s=60.0, give_up_past_ceiling=False)


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
    honoured_retry_after: bool = False
    """The first retry waited the server's Retry-After (not the client's own back-off)."""

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


def parse_retry_after_s(
    headers: Mapping[str, str], now_epoch_s: float, ceiling_s: float = SDK_RETRY_AFTER_CEILING_S
) -> float | None:
    """Seconds the server asked us to wait, as ``_parse_retry_after_header`` reads them:
    ``retry-after-ms``, then ``retry-after`` as seconds (a value that is not a number is skipped; one
    that overflows to infinity without saying so counts as just past ``ceiling_s``), then
    ``retry-after`` as an HTTP date; ``None`` when none of them reads."""
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            delay = float(value)
        except ValueError:
            continue
        if delay == math.inf and value.strip().lower() not in _INFINITIES:
            return ceiling_s + 1.0
        return delay / divisor
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        parsed = email.utils.parsedate_tz(value)
        if parsed is None:
            return None
        return float(email.utils.mktime_tz(parsed)) - now_epoch_s
    except (TypeError, ValueError, OverflowError):
        return None


def honours(policy: RetryPolicy, header_wait_s: float | None) -> bool:
    """Whether the client waits the server's time: finite and in (0, ceiling]."""
    return (
        header_wait_s is not None
        and math.isfinite(header_wait_s)
        and 0 < header_wait_s <= policy.max_header_wait_s
    )


def retry_wait_s(
    policy: RetryPolicy, retries_done: int, header_wait_s: float | None, rng: random.Random
) -> float:
    """The server's wait when ``honours`` it; otherwise back-off with up to 25 % jitter off."""
    if honours(policy, header_wait_s):
        assert header_wait_s is not None
        return header_wait_s
    backoff_s = min(policy.initial_backoff_s * 2.0 ** min(retries_done, 1000), policy.max_backoff_s)
    return max(0.0, backoff_s * (1.0 - 0.25 * rng.random()))


def should_retry(
    status: int, headers: Mapping[str, str], policy: RetryPolicy | None = None, now_epoch_s: float = 0.0
) -> bool:
    """Whether a failed attempt is retried (``_should_retry``): not when the server's wait is past
    the ceiling (the current SDK; ``policy.give_up_past_ceiling``), else as ``x-should-retry``
    says, else on 408, 409, 429 and 5xx. ``status`` 0 is a broken connection: always retried."""
    if status == 0:
        return True
    policy = policy or RetryPolicy()
    if policy.give_up_past_ceiling:
        wait_s = parse_retry_after_s(headers, now_epoch_s, policy.max_header_wait_s)
        if wait_s is not None and math.isfinite(wait_s) and wait_s > policy.max_header_wait_s:
            return False
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
        honoured = False
        itl_s: list[float] = []
        while True:
            itl_s.clear()
            attempt = await self._attempt(path, body, deadline_s, itl_s, retries)
            if attempt.status == 200 and attempt.error is None:
                break
            policy = self._retry
            if policy is None or retries >= policy.max_retries:
                break
            headers = attempt.headers or {}
            now_epoch_s = time.time()
            if not should_retry(attempt.status, headers, policy, now_epoch_s):
                break
            # The SDK reads no server wait after a broken connection: it backs off.
            header_wait_s = (
                None
                if attempt.status == 0
                else parse_retry_after_s(headers, now_epoch_s, policy.max_header_wait_s)
            )
            wait_s = retry_wait_s(policy, retries, header_wait_s, self._rng)
            if time.perf_counter() + wait_s >= deadline_s:
                break
            if retries == 0:
                honoured = honours(policy, header_wait_s)
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
            honoured_retry_after=honoured,
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
