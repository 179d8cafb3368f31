"""The failure paths of a disaggregated request (``kvgate.gateway.request_path.handoff`` and
``relay``), each through the real gateway in front of simulated prefill and decode replicas, each
ending with every reservation, queue and work gauge of both pools back at zero.

A replica that has to misbehave sits behind a ``faulty_front``: the simulated replica stays real
(probes, metrics, KV pulls), only its completion answers are the fault's."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import pytest

from kvgate.config.gateway import GatewayConfig
from kvgate.gateway.edge.server import RunningGateway, running_gateway
from kvgate.vocabulary.replica import ReplicaLoad
from tests.integration.conftest import MODEL, eventually, gateway_config
from tests.integration.faulty_replica import Fault, faulty_front
from tests.integration.test_gateway_pd import CAPACITY, FAST, ask, assert_pools_idle, events, pd_fleet

PATIENT = {"interval_s": 1.0, "timeout_s": 2.0}
"""Probes slow enough that a paused replica is not ejected by them while a test holds it."""


def pools_config(
    prefill: list[str], decode: list[str], health: dict[str, Any] = FAST, **decode_pool: Any
) -> GatewayConfig:
    pools = [
        {"name": "prefill", "role": "prefill", "replicas": prefill, **CAPACITY},
        {"name": "decode", "role": "decode", "replicas": decode, **CAPACITY, **decode_pool},
    ]
    return gateway_config([], pools=pools, health=health)


def retries(gw: RunningGateway) -> str:
    return "\n".join(
        line
        for line in gw.gateway.metrics.render().decode().splitlines()
        if line.startswith("kvgate_retries_total")
    )


async def routable(gw: RunningGateway) -> RunningGateway:
    """The gateway once its first probes found every replica up: a request sent sooner may find
    none routable yet (503 no_replica) on a busy machine."""
    assert await eventually(lambda: all(r.healthy for r in gw.state.replicas.values()))
    return gw


def served(replica: Any) -> int:
    return sum(replica.engine.stats.request_success.values())


async def test_a_decode_replica_failing_before_its_first_byte_is_replaced_by_another() -> None:
    async with (
        pd_fleet(prefill=1, decode=2) as fleet,
        faulty_front(fleet.urls[1], Fault(status=503)) as front,
    ):
        config = pools_config([fleet.urls[0]], [front.url, fleet.urls[2]])
        async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            await routable(gw)
            answers = []
            for stream in (True, False, True, False):
                answers.append(await ask(http, "/v1/completions", stream))
                if front.faulted:
                    break
            assert front.faulted == 1, "the failing decode replica was tried once (then ejected or avoided)"
            for status, body in answers:
                assert status == 200, body
                assert b'"error"' not in body
                streamed = body.startswith(b"data: ")
                usage = events(body)[-1]["usage"] if streamed else orjson.loads(body)["usage"]
                assert usage["completion_tokens"] == 12
            assert served(fleet.replicas[0]) == len(answers), "one prefill each: the retry reused the KV"
            assert served(fleet.replicas[2]) == len(answers)
            assert served(fleet.replicas[1]) == 0
            assert 'outcome="retry"' in retries(gw)
            await assert_pools_idle(gw)


async def test_a_prefill_answer_without_kv_transfer_params_is_a_502() -> None:
    fault = Fault(strip_kv_transfer_params=True)
    async with (
        pd_fleet(prefill=1, decode=1) as fleet,
        faulty_front(fleet.urls[0], fault) as front,
        running_gateway(pools_config([front.url], [fleet.urls[1]])) as gw,
        httpx.AsyncClient(base_url=gw.url, timeout=30) as http,
    ):
        await routable(gw)
        for stream in (False, True):
            response = await http.post(
                "/v1/completions",
                json={"model": MODEL, "prompt": "hand me off", "max_tokens": 8, "stream": stream},
            )
            assert response.status_code == 502, response.text
            error = response.json()["error"]
            assert error["type"] == "BadGatewayError" and "kv_transfer_params" in error["message"]
        assert front.faulted == 2
        assert served(fleet.replicas[1]) == 0, "no decode replica was asked to pull what was not offered"
        await assert_pools_idle(gw)


@pytest.mark.parametrize(
    ("fault", "status", "error_type"),
    [
        (Fault(status=429, retry_after_s=3), 429, "RateLimitError"),
        (Fault(status=500), 502, "BadGatewayError"),
        (Fault(status=503), 503, "ServiceUnavailableError"),
    ],
    ids=["429", "500", "503"],
)
async def test_a_prefill_replica_answering_an_error_is_retried_then_answered(
    fault: Fault, status: int, error_type: str
) -> None:
    async with pd_fleet(prefill=2, decode=1) as fleet, faulty_front(fleet.urls[0], fault) as front:
        config = pools_config([front.url, fleet.urls[1]], [fleet.urls[2]])
        async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            await routable(gw)
            for stream in (False, True, False, True):
                code, body = await ask(http, "/v1/completions", stream)
                assert code == 200 and b'"error"' not in body, body
                if front.faulted:
                    break
            assert front.faulted >= 1, "the failing prefill replica was tried"
            assert 'outcome="retry"' in retries(gw)
            await assert_pools_idle(gw)
        async with running_gateway(pools_config([front.url], [fleet.urls[2]])) as alone:
            await routable(alone)
            async with httpx.AsyncClient(base_url=alone.url, timeout=30) as http:
                response = await http.post(
                    "/v1/completions", json={"model": MODEL, "prompt": "nowhere else", "max_tokens": 8}
                )
            assert response.status_code == status, response.text
            assert response.json()["error"]["type"] == error_type
            if status == 429:
                assert response.headers["retry-after"] == "3"
            await assert_pools_idle(alone)


async def test_the_decode_pool_filling_between_prefill_and_hand_off_refuses_with_its_wait() -> None:
    async with pd_fleet(prefill=1, decode=1) as fleet:
        config = pools_config([fleet.urls[0]], [fleet.urls[1]], PATIENT, kv_capacity_tokens=1000)
        async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            await routable(gw)
            await fleet.pause(0)
            first = asyncio.create_task(ask(http, "/v1/completions", stream=False, max_tokens=600))
            second = asyncio.create_task(ask(http, "/v1/completions", stream=True, max_tokens=600))
            assert await eventually(lambda: len(fleet.replicas[0]._stalled) == 2), "both admitted to prefill"
            await fleet.resume(0)
            answers = sorted([await first, await second])
            assert answers[0][0] == 200, answers
            status, body = answers[1]
            assert status == 429, body
            assert b"decode replicas" in body and b'"reason":"kv_capacity"' in body
            assert served(fleet.replicas[1]) == 1
            await assert_pools_idle(gw)


async def test_a_client_leaving_during_prefill_leaves_nothing_held() -> None:
    async with pd_fleet(prefill=1, decode=1) as fleet:
        config = pools_config([fleet.urls[0]], [fleet.urls[1]], PATIENT)
        async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            await routable(gw)
            await fleet.pause(0)
            for stream, stalled in ((False, 1), (True, 2)):
                leaving = asyncio.create_task(ask(http, "/v1/completions", stream=stream))
                assert await eventually(lambda: len(fleet.replicas[0]._stalled) == stalled)  # noqa: B023
                assert gw.state.ledger.totals().pending_prompt_tokens > 0, "the prefill is reserved"
                leaving.cancel()
                await asyncio.gather(leaving, return_exceptions=True)
                assert await eventually(lambda: gw.state.in_flight == 0)
                assert await eventually(lambda: gw.state.ledger.totals() == ReplicaLoad()), (
                    "released when the client left, before the prefill replica answered"
                )
            await fleet.resume(0)
            assert served(fleet.replicas[1]) == 0
            assert (await ask(http, "/v1/completions", stream=True))[0] == 200, "the pair serves on"
            await assert_pools_idle(gw)
