"""Every refusal reason reaches a client through a real gateway as an OpenAI error: its status, its
body (``type``, ``code``, ``reason``, a message), ``Retry-After`` and ``retry-after-ms`` from the
same estimate, ``x-should-retry: false`` only where the gateway holds no room for the client at that
time (past the cap, a full queue, a request it could not recognise coming back), and the exception
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
    """``x-should-retry`` as sent: absent where the gateway holds room for the client at the time it
    names, ``false`` where it does not (past the cap, a full queue, a request it could not tell
    coming back)."""
    holder: bool = True
    own_key: bool = True
    """The client sends an ``Idempotency-Key``, so its return can be recognised and promised a slot."""
    sdk_retries: int = 0
    """The SDK's ``max_retries``: above 0 only where it is told not to retry (else it would wait)."""


RATE_LIMITED = (429, "RateLimitError", openai.RateLimitError)
CASES = [
    Case("kv_capacity", *RATE_LIMITED, {"max_queue_wait_s": 0}),
    Case(
        "kv_capacity",
        *RATE_LIMITED,
        {"max_queue_wait_s": 0, "retry_after_cap_s": 2},
        should_retry="false",
        sdk_retries=2,
    ),
    Case("kv_capacity", *RATE_LIMITED, {"max_queue_wait_s": 0}, should_retry="false", own_key=False),
    Case(
        "queue_full",
        *RATE_LIMITED,
        {"queue_max_requests": 1},
        queued_first=1,
        should_retry="false",
        sdk_retries=2,
    ),
    Case("tenant_budget", *RATE_LIMITED, budget_tokens_per_min=KV_CAPACITY_TOKENS),
    Case("deadline", *RATE_LIMITED, headers={"x-request-timeout-ms": "500"}),
    Case("ttft_slo", *RATE_LIMITED, {"models": {MODEL: {"ttft_slo_s": 0.5}}}),
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
    assert await eventually(lambda: all(r.healthy for r in gw.state.replicas.values())), "probed up"
    holder = asyncio.create_task(
        http.post("/v1/completions", json={**body(HOLDER_MAX_TOKENS), "stream": True})
    )
    assert await eventually(lambda: gw.state.ledger.totals().resident_sequences == 1)
    return holder


def case_id(case: Case) -> str:
    if not case.own_key:
        return case.reason + "-unrecognisable"
    return case.reason + ("-past-cap" if case.admission.get("retry_after_cap_s") else "")


@pytest.mark.parametrize("case", CASES, ids=case_id)
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

            own_key = {"idempotency-key": f"probe-{case.reason}"} if case.own_key else {}
            answer = await http.post(
                "/v1/completions", json=body(PROBE_MAX_TOKENS), headers={**case.headers, **own_key}
            )
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

            retries = case.sdk_retries
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
