"""What an SRE reads off ``/metrics`` after real traffic through the gateway to the simulator: every
answer of the completion routes counted by code and reason, a dead replica's failures by kind under
its name (never its URL), the retry that saved the request and the replica's ejection, the build and
the process."""

from __future__ import annotations

import asyncio
import importlib.metadata
import platform
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvgate.gateway.edge.server import RunningGateway, running_gateway
from kvgate.routing.health import HealthState
from kvgate.sim.fleet import SimFleet
from kvgate.sim.ports import free_ports
from tests.integration.conftest import MODEL, assert_idle, gateway_config
from tests.integration.test_admission_gateway import completion, config_for, small_fleet

Series = dict[str, list[tuple[dict[str, str], float]]]


async def scraped(http: httpx.AsyncClient) -> Series:
    response = await http.get("/metrics")
    assert response.status_code == 200
    out: Series = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def responses(series: Series) -> dict[tuple[str, str], float]:
    return {(lbl["code"], lbl["reason"]): v for lbl, v in series.get("kvgate_responses_total", [])}


async def test_every_answer_of_the_completion_routes_is_counted_by_code_and_reason() -> None:
    async with small_fleet() as fleet, running_gateway(config_for(fleet, max_queue_wait_s=0)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            answers = await asyncio.gather(
                *(http.post("/v1/completions", json=completion()) for _ in range(24))
            )
            malformed = await http.post("/v1/chat/completions", content=b'{"model": ')
            unknown = await http.post("/v1/chat/completions", json={"model": "gpt-9", "messages": []})
            replica_400 = await http.post("/v1/completions", json=completion(max_tokens=2, min_tokens=5))
            wrong_method = await http.get("/v1/completions")
            series = await scraped(http)
        codes = [a.status_code for a in answers]
        assert codes.count(429) > 0 and codes.count(200) > 0, codes
        assert [malformed.status_code, unknown.status_code, replica_400.status_code] == [400, 404, 400]
        assert wrong_method.status_code == 405
        assert responses(series) == {
            ("200", "replica"): codes.count(200),
            ("429", "kv_capacity"): codes.count(429),
            ("400", "invalid_request"): 1,
            ("404", "model_not_found"): 1,
            ("400", "replica"): 1,
            ("405", "method_not_allowed"): 1,
        }
        await assert_idle(gw)


async def test_no_routable_replica_is_counted_as_503_no_replica() -> None:
    config = gateway_config([f"http://127.0.0.1:{free_ports()}"])
    async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url) as http:
        answer = await http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2})
        assert answer.status_code == 503
        series = await scraped(http)
        assert responses(series) == {("503", "no_replica"): 1}
        (name,) = [r.name for r in gw.state.replicas.values()]
        ejections = {lbl["replica"]: v for lbl, v in series["kvgate_replica_ejections_total"]}
        assert ejections.keys() == {name}, "a replica's series are declared by its first probe"
        await assert_idle(gw)


def health_of(gw: RunningGateway, url: str) -> HealthState:
    return gw.gateway.path.fleet.health.get(url).state


async def test_a_dead_replica_counts_its_errors_by_kind_the_retries_and_its_ejection() -> None:
    async with SimFleet(replicas=2, time_scale=0.0, seed=0) as fleet:
        config = gateway_config(
            fleet.urls,
            health={"interval_s": 3600, "unhealthy_threshold": 1},
            routing={"warmup_s": 0, "ejection_backoff_base_s": 3600, "ejection_backoff_max_s": 3600},
        )
        async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            dead = gw.state.replicas[fleet.urls[0]]
            await fleet.kill(0)
            sent = 0
            while health_of(gw, dead.url) is not HealthState.EJECTED and sent < 50:
                answer = await http.post(
                    "/v1/completions", json={"model": MODEL, "prompt": f"q{sent}", "max_tokens": 2}
                )
                assert answer.status_code == 200, answer.text
                sent += 1
            assert health_of(gw, dead.url) is HealthState.EJECTED
            series = await scraped(http)
        errors = {(lbl["replica"], lbl["kind"]): v for lbl, v in series["kvgate_upstream_errors_total"] if v}
        assert errors == {(dead.name, "connect"): 1}
        assert not any(
            "http" in lbl["replica"]
            for name in ("kvgate_upstream_errors_total", "kvgate_replica_ejections_total")
            for lbl, _ in series[name]
        )
        ejections = {lbl["replica"]: v for lbl, v in series["kvgate_replica_ejections_total"]}
        assert ejections == {dead.name: 1, gw.state.replicas[fleet.urls[1]].name: 0}
        retries = {lbl["outcome"]: v for lbl, v in series["kvgate_retries_total"] if lbl["pool"] == "default"}
        assert retries["retry"] == 1 and retries["retry_budget"] == 0
        assert responses(series) == {("200", "replica"): sent}
        await assert_idle(gw)


async def test_build_info_and_process_metrics_are_exported(fleet: SimFleet) -> None:
    async with running_gateway(gateway_config(fleet.urls)) as gw, httpx.AsyncClient(base_url=gw.url) as http:
        series = await scraped(http)
        version = importlib.metadata.version("kvgate")
        assert series["kvgate_build_info"] == [
            ({"version": version, "python": platform.python_version()}, 1.0)
        ]
        for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"):
            assert len(series[name]) == 1 and series[name][0][1] > 0, name
        await assert_idle(gw)


async def test_a_stalled_event_loop_shows_in_the_loop_lag_histogram(fleet: SimFleet) -> None:
    """The gateway serves on this test's event loop, so blocking it here stalls the gateway as a
    long garbage collection or a CPU throttle would; the next wake-up of its lag timer says so."""
    async with running_gateway(gateway_config(fleet.urls)) as gw, httpx.AsyncClient(base_url=gw.url) as http:
        await asyncio.sleep(0.35)
        before = await scraped(http)
        quiet = dict((lbl["le"], v) for lbl, v in before["kvgate_event_loop_lag_seconds_bucket"])
        assert before["kvgate_event_loop_lag_seconds_count"][0][1] >= 2
        time.sleep(0.6)  # the loop itself stalls: nothing else in this process runs meanwhile
        await asyncio.sleep(0.25)
        after = await scraped(http)
        stalled = dict((lbl["le"], v) for lbl, v in after["kvgate_event_loop_lag_seconds_bucket"])
        late = (stalled["+Inf"] - stalled["0.25"]) - (quiet["+Inf"] - quiet["0.25"])
        assert late == 1, (quiet, stalled)
        assert (
            after["kvgate_event_loop_lag_seconds_sum"][0][1]
            - before["kvgate_event_loop_lag_seconds_sum"][0][1]
            >= 0.4
        )
        await assert_idle(gw)
