"""Queued clients that hang up leave nothing behind, and the reservation lease is a real backstop.

The race: a queued client's disconnect cancels its waiting future at once, but its task only hears
of it on a later turn of the event loop; a release in between runs the pump, which must not route
(and reserve for) a request whose client already left. Whatever still leaks is released when its
lease runs out, counted in ``kvgate_reservations_expired_total`` and logged."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx
import pytest

from kvgate.admission.cost import CostEstimate
from kvgate.admission.decision import Refusal
from kvgate.config.gateway import GatewayConfig
from kvgate.gateway.edge.server import running_gateway
from kvgate.gateway.request_path.decision_path import DecisionPath
from kvgate.gateway.request_path.dispatcher import Route
from kvgate.gateway.state import GatewayState, ProxyRequest
from kvgate.gateway.telemetry.metrics import GatewayMetrics
from kvgate.routing.health import Outcome
from kvgate.sim.fleet import SimFleet
from kvgate.vocabulary.replica import ReplicaLoad
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config

KV_CAPACITY_TOKENS = 4000


def config(urls: list[str], **admission: Any) -> GatewayConfig:
    pool = {"name": "default", "replicas": urls, "kv_capacity_tokens": KV_CAPACITY_TOKENS}
    pool["max_sequences"] = 16
    return gateway_config(urls, pools=[pool], admission={"max_queue_wait_s": 300, **admission})


def proxy_request(i: int, max_tokens: int = 900) -> ProxyRequest:
    body = {"model": MODEL, "prompt": f"request {i}", "max_tokens": max_tokens}
    return ProxyRequest(f"r{i}", f"r{i}", "/v1/completions", MODEL, False, body, b"{}", [], [])


async def admit(path: DecisionPath, request: ProxyRequest) -> Route | Refusal:
    request.arrived_s = path.clock()
    refusal = await path.pricer.price(request)
    return refusal if refusal is not None else await path.dispatcher.admit(request)


async def test_a_waiter_cancelled_just_before_the_pump_runs_is_not_routed_and_nothing_leaks() -> None:
    state = GatewayState.from_config(config(["http://127.0.0.1:9"]))
    path = DecisionPath.build(state, config(["http://127.0.0.1:9"]), GatewayMetrics())
    for replica in state.replicas.values():
        path.fleet.observe_outcome(replica, Outcome.SUCCESS)
    holders = [proxy_request(i) for i in range(4)]
    routes = [await admit(path, request) for request in holders]
    assert all(isinstance(route, Route) for route in routes)
    waiters = [proxy_request(100 + i) for i in range(3)]
    tasks = [asyncio.create_task(admit(path, request)) for request in waiters]
    await asyncio.sleep(0)
    assert state.queued == 3
    for task in tasks:
        task.cancel()
    for request, route in zip(holders, routes, strict=True):
        assert isinstance(route, Route)
        path.dispatcher.release(request)
    for task in tasks:
        with pytest.raises(asyncio.CancelledError):
            await task
    assert state.ledger.totals() == ReplicaLoad(), "no reservation for a client that left"
    assert state.queued == 0
    assert path.dispatcher.controller.queue_stats(0.0).requests == 0


async def test_a_storm_of_queued_clients_hanging_up_returns_every_gauge_to_zero() -> None:
    overrides = {"warmup_s": 0, "kv_capacity_tokens": KV_CAPACITY_TOKENS, "max_num_seqs": 16}
    async with (
        SimFleet(replicas=1, time_scale=0.5, seed=0, overrides=overrides) as fleet,
        running_gateway(config(fleet.urls)) as gw,
    ):
        hold = {"model": MODEL, "prompt": "hold", "max_tokens": 990, "ignore_eos": True}
        small = {**hold, "max_tokens": 100}
        limits = httpx.Limits(max_connections=400)
        async with httpx.AsyncClient(base_url=gw.url, timeout=120, limits=limits) as http:
            holders = [asyncio.create_task(http.post("/v1/completions", json=hold)) for _ in range(4)]
            assert await eventually(lambda: gw.state.ledger.totals().resident_sequences == 4)
            storm = [asyncio.create_task(http.post("/v1/completions", json=small)) for _ in range(150)]
            assert await eventually(lambda: gw.state.queued == 150, timeout_s=30)
            for task in storm:
                task.cancel()
            answers = await asyncio.gather(*holders)
            assert all(answer.status_code == 200 for answer in answers)
            await asyncio.gather(*storm, return_exceptions=True)
            await assert_idle(gw)


async def test_an_expired_lease_releases_a_leaked_reservation_counts_it_and_logs_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with (
        SimFleet(replicas=1, time_scale=0.0, seed=0) as fleet,
        running_gateway(config(fleet.urls, reservation_lease_s=0.5)) as gw,
        httpx.AsyncClient(base_url=gw.url, timeout=30) as http,
    ):
        body = {"model": MODEL, "prompt": "a live request renews its lease", "max_tokens": 4}
        assert (await http.post("/v1/completions", json=body)).status_code == 200
        replica_id = next(iter(gw.state.replicas))
        leaked = CostEstimate(MODEL, 100, 200, 131072)
        caplog.set_level(logging.WARNING, logger="kvgate.leases")
        assert gw.state.ledger.reserve("leaked", replica_id, leaked, time.monotonic())
        assert gw.state.ledger.totals().resident_sequences == 1
        assert await eventually(lambda: gw.state.ledger.totals() == ReplicaLoad(), timeout_s=10)
        metrics = (await http.get("/metrics")).text
        assert 'kvgate_reservations_expired_total{pool="default"} 1.0' in metrics
        assert any("leaked" in record.getMessage() for record in caplog.records)
        await assert_idle(gw)


async def test_a_request_longer_than_the_lease_keeps_its_reservation() -> None:
    overrides = {"warmup_s": 0, "kv_capacity_tokens": KV_CAPACITY_TOKENS, "max_num_seqs": 16}
    async with (
        SimFleet(replicas=1, time_scale=1.0, seed=0, overrides=overrides) as fleet,
        running_gateway(config(fleet.urls, reservation_lease_s=0.3)) as gw,
        httpx.AsyncClient(base_url=gw.url, timeout=60) as http,
    ):
        body = {"model": MODEL, "prompt": "slow", "max_tokens": 200, "ignore_eos": True, "stream": True}
        async with http.stream("POST", "/v1/completions", json=body) as response:
            seen = 0
            async for _ in response.aiter_bytes():
                seen += 1
                if seen % 20 == 0 and seen <= 160:
                    assert gw.state.ledger.totals().resident_sequences == 1
        metrics = (await http.get("/metrics")).text
        assert 'kvgate_reservations_expired_total{pool="default"} 1.0' not in metrics
        await assert_idle(gw)


async def test_a_retry_goes_only_where_admission_would_admit_it() -> None:
    """The retry after a dead replica must respect the inter-token-latency guard: with the only
    other replica at its guard, the retry is refused rather than pushed past it."""
    overrides = {"warmup_s": 0, "kv_capacity_tokens": KV_CAPACITY_TOKENS, "max_num_seqs": 16}
    async with SimFleet(replicas=2, time_scale=1.0, seed=0, overrides=overrides) as fleet:
        settings = config(fleet.urls, max_active_sequences_per_replica=1, max_queue_wait_s=0)
        settings = settings.model_copy(
            update={"health": settings.health.model_copy(update={"interval_s": 60.0})}
        )
        async with running_gateway(settings) as gw, httpx.AsyncClient(base_url=gw.url, timeout=60) as http:
            body = {"model": MODEL, "prompt": "hold", "max_tokens": 300, "ignore_eos": True, "stream": True}
            holder = asyncio.create_task(http.post("/v1/completions", json=body))
            assert await eventually(lambda: gw.state.ledger.totals().resident_sequences == 1)
            (busy,) = [
                r.replica.replica_id for r in gw.gateway.path.dispatcher.leases.requests() if r.replica
            ]
            idle = next(i for i, url in enumerate(fleet.urls) if url != busy)
            await fleet.kill(idle)
            answer = await http.post("/v1/completions", json={**body, "stream": False, "max_tokens": 5})
            assert answer.status_code in (502, 503), answer.text
            assert gw.state.ledger.load(busy).resident_sequences == 1, "the guard of one held"
            assert (await holder).status_code == 200
        await assert_idle(gw)
