"""The client's retry manners against a loopback server that answers 429 with Retry-After first."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from kvgate.loadtest.client import Client, RetryPolicy

STREAM = (
    b'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"lo"}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"!"}}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}\n\n'
    b"data: [DONE]\n\n"
)


class Flaky:
    """Rejects the first ``rejections`` requests with the given headers, then streams."""

    def __init__(self, rejections: int, headers: dict[str, str]) -> None:
        self.rejections = rejections
        self.headers = headers
        self.calls = 0
        self.retry_counts: list[str | None] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.calls += 1
        self.retry_counts.append(request.headers.get("x-stainless-retry-count"))
        if self.calls <= self.rejections:
            return web.json_response(
                {"error": {"message": "over capacity", "type": "rate_limit"}},
                status=429,
                headers=self.headers,
            )
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for event in STREAM.split(b"\n\n")[:-1]:
            await response.write(event + b"\n\n")
        await response.write_eof()
        return response


@pytest.fixture
async def serve() -> AsyncIterator[object]:
    runners: list[web.AppRunner] = []

    async def start(handler: Flaky) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


async def test_stream_is_timed_and_usage_read(serve: object) -> None:
    url = await serve(Flaky(0, {}))  # type: ignore[operator]
    async with aiohttp.ClientSession() as session:
        record = await Client(session, url).send("/v1/chat/completions", b"{}", index=3, class_name="c")
    assert record.ok
    assert (record.index, record.class_name, record.status) == (3, "c", 200)
    assert (record.prompt_tokens, record.completion_tokens) == (7, 3)
    assert len(record.itl_s) == 2
    assert record.ttft_s is not None
    assert record.ttft_s + sum(record.itl_s) <= record.e2e_s


async def test_retry_after_ms_is_honoured(serve: object) -> None:
    flaky = Flaky(1, {"retry-after-ms": "50", "retry-after": "7"})
    url = await serve(flaky)  # type: ignore[operator]
    async with aiohttp.ClientSession() as session:
        record = await Client(session, url, retry=RetryPolicy()).send("/v1/chat/completions", b"{}")
    assert record.ok
    assert flaky.calls == 2
    assert record.retries == 1
    assert record.wait_honoured_s == 0.05
    assert record.honoured_retry_after
    assert flaky.retry_counts == ["0", "1"]
    assert record.ttft_s is not None
    assert record.ttft_s >= record.wait_honoured_s


async def test_plain_client_does_not_retry(serve: object) -> None:
    flaky = Flaky(1, {"retry-after": "1"})
    url = await serve(flaky)  # type: ignore[operator]
    async with aiohttp.ClientSession() as session:
        record = await Client(session, url).send("/v1/chat/completions", b"{}")
    assert record.rejected
    assert record.error == "over capacity"
    assert (flaky.calls, record.retries, record.wait_honoured_s) == (1, 0, 0.0)


async def test_retry_budget_and_deadline_bound_the_retries(serve: object) -> None:
    budget = Flaky(10, {"retry-after-ms": "10"})
    url = await serve(budget)  # type: ignore[operator]
    async with aiohttp.ClientSession() as session:
        record = await Client(session, url, retry=RetryPolicy(max_retries=2)).send(
            "/v1/chat/completions", b"{}"
        )
    assert record.rejected
    assert (budget.calls, record.retries) == (3, 2)

    deadline = Flaky(10, {"retry-after": "30"})
    url = await serve(deadline)  # type: ignore[operator]
    async with aiohttp.ClientSession() as session:
        record = await Client(session, url, retry=RetryPolicy()).send(
            "/v1/chat/completions", b"{}", timeout_s=5.0
        )
    assert record.rejected
    assert (deadline.calls, record.retries, record.wait_honoured_s) == (1, 0, 0.0)


@pytest.mark.parametrize(
    "headers",
    [{"retry-after": "121"}, {"retry-after-ms": "50", "x-should-retry": "false"}],
    ids=["past-the-ceiling", "told-not-to"],
)
async def test_the_sdk_does_not_retry_past_the_ceiling_or_when_told_not_to(
    serve: object, headers: dict[str, str]
) -> None:
    flaky = Flaky(1, headers)
    url = await serve(flaky)  # type: ignore[operator]
    async with aiohttp.ClientSession() as session:
        record = await Client(session, url, retry=RetryPolicy()).send("/v1/chat/completions", b"{}")
    assert record.rejected
    assert (flaky.calls, record.retries, record.honoured_retry_after) == (1, 0, False)


async def test_without_a_server_wait_the_client_backs_off_and_says_so(serve: object) -> None:
    flaky = Flaky(1, {})
    url = await serve(flaky)  # type: ignore[operator]
    async with aiohttp.ClientSession() as session:
        record = await Client(session, url, retry=RetryPolicy(initial_backoff_s=0.01)).send(
            "/v1/chat/completions", b"{}"
        )
    assert record.ok and record.retries == 1
    assert not record.honoured_retry_after
    assert 0.0075 <= record.wait_honoured_s <= 0.01
