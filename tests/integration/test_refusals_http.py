"""Every refusal reason reaches a client through a real gateway as an OpenAI error: its status, its
body (``type``, ``code``, ``reason``, a message), ``Retry-After`` and ``retry-after-ms`` from the
same estimate, ``x-should-retry: false`` only when the honest wait is past the cap, and the exception
class the official ``openai`` SDK raises for it.

One simulated replica holds 4,000 KV tokens; a held request (a stream of 3,800 output tokens at real
simulated speed) fills it, so the next request has to wait or be refused, and the configuration
picks which refusal it gets. ``no_replica`` needs no holder: its pool's only replica never answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest

from kvgate.gateway.edge.server import RunningGateway, running_gateway
from kvgate.sim.fleet import SimFleet
from kvgate.sim.ports import free_ports
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config

KV_CAPACITY_TOKENS = 4000
KEY = "sk-team"
PROMPT = "Summarise the following words: " + " ".join(f"item{i}" for i in range(24))
PROBE_MAX_TOKENS = 500
HOLDER_MAX_TOKENS = 3800


@dataclass(frozen=True)
class Case:
    reason: str
    status: int
    error_type: str
    sdk_error: type[openai.APIStatusError]
    admission: dict[str, Any] = field(default_factory=dict)
    budget_tokens_per_min: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    queued_first: int = 0
    """Requests sent (and left waiting) after the holder, before the refused one."""
    should_retry: str | None = None
    """``x-should-retry`` as sent: absent while the hint is honest, ``false`` past the cap."""
    holder: bool = True


CASES = [
    Case("kv_capacity", 429, "RateLimitError", openai.RateLimitError, {"max_queue_wait_s": 0}),
    Case(
        "kv_capacity",
        429,
        "RateLimitError",
        openai.RateLimitError,
        {"max_queue_wait_s": 0, "retry_after_cap_s": 2},
        should_retry="false",
    ),
    Case(
        "queue_full", 429, "RateLimitError", openai.RateLimitError, {"queue_max_requests": 1}, queued_first=1
    ),
    Case(
        "tenant_budget",
        429,
        "RateLimitError",
        openai.RateLimitError,
        budget_tokens_per_min=KV_CAPACITY_TOKENS,
    ),
    Case("deadline", 429, "RateLimitError", openai.RateLimitError, headers={"x-request-timeout-ms": "500"}),
    Case("ttft_slo", 429, "RateLimitError", openai.RateLimitError, {"models": {MODEL: {"ttft_slo_s": 0.5}}}),
    Case("no_replica", 503, "ServiceUnavailableError", openai.InternalServerError, holder=False),
]


def config_for(urls: list[str], case: Case) -> Any:
    tenant: dict[str, Any] = {"name": "team"}
    if case.budget_tokens_per_min is not None:
        tenant["tokens_per_min"] = case.budget_tokens_per_min
    admission = {
        "max_queue_wait_s": 300,
        "default_inter_token_s": 0.01,
        "tenants": [tenant],
        **case.admission,
    }
    pools = [{"name": "default", "replicas": urls, "kv_capacity_tokens": KV_CAPACITY_TOKENS}]
    auth = {"enabled": True, "tenants": [{"name": "team", "api_keys": [KEY]}]}
    return gateway_config(urls, pools=pools, admission=admission, auth=auth)


@asynccontextmanager
async def fleet_for(case: Case) -> AsyncIterator[list[str]]:
    if not case.holder:
        yield [f"http://127.0.0.1:{free_ports()}"]
        return
    overrides = {"warmup_s": 0, "kv_capacity_tokens": KV_CAPACITY_TOKENS}
    async with SimFleet(replicas=1, time_scale=1.0, seed=0, overrides=overrides) as fleet:
        yield fleet.urls


def body(max_tokens: int) -> dict[str, Any]:
    return {"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True}


async def hold(gw: RunningGateway, http: httpx.AsyncClient) -> asyncio.Task[Any]:
    """A long stream that takes nearly all the replica's KV until it is cancelled."""
    holder = asyncio.create_task(
        http.post("/v1/completions", json={**body(HOLDER_MAX_TOKENS), "stream": True})
    )
    assert await eventually(lambda: gw.state.ledger.totals().resident_sequences == 1)
    return holder


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.reason + ("-past-cap" if c.should_retry else ""))
async def test_each_refusal_reaches_the_client_as_an_openai_error(case: Case) -> None:
    async with fleet_for(case) as urls, running_gateway(config_for(urls, case)) as gw:
        auth = {"authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(base_url=gw.url, timeout=30, headers=auth) as http:
            background = [await hold(gw, http)] if case.holder else []
            for _ in range(case.queued_first):
                background.append(
                    asyncio.create_task(http.post("/v1/completions", json=body(PROBE_MAX_TOKENS)))
                )
            assert await eventually(lambda: gw.state.queued == case.queued_first)

            answer = await http.post("/v1/completions", json=body(PROBE_MAX_TOKENS), headers=case.headers)
            assert answer.status_code == case.status, answer.text
            assert answer.headers["content-type"] == "application/json"
            error = answer.json()["error"]
            assert error["reason"] == case.reason
            assert error["type"] == case.error_type
            assert error["code"] == case.status
            assert error["message"]
            seconds = int(answer.headers["retry-after"])
            milliseconds = int(answer.headers["retry-after-ms"])
            assert seconds >= 1 and 1 <= milliseconds <= seconds * 1000 < milliseconds + 1000
            assert f"Retry after {seconds} s." in error["message"]
            assert answer.headers.get("x-should-retry") == case.should_retry

            retries = 2 if case.should_retry == "false" else 0
            attempts: list[httpx.Request] = []

            async def count(request: httpx.Request) -> None:
                attempts.append(request)

            sdk_http = httpx.AsyncClient(event_hooks={"request": [count]})
            client = openai.AsyncOpenAI(
                base_url=gw.url + "/v1", api_key=KEY, max_retries=retries, http_client=sdk_http
            )
            async with client:
                with pytest.raises(case.sdk_error) as raised:
                    await client.completions.create(
                        model=MODEL,
                        prompt=PROMPT,
                        max_tokens=PROBE_MAX_TOKENS,
                        extra_body={"ignore_eos": True},
                        extra_headers=case.headers,
                    )
            assert raised.value.status_code == case.status
            assert isinstance(raised.value.body, dict) and raised.value.body["reason"] == case.reason
            assert len(attempts) == 1, "the SDK retries only when told it may, and not past the cap"

            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
        await assert_idle(gw)
