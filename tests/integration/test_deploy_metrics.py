"""Every metric the manifests query exists: ``kvgate serve`` runs as its own process with the base
ConfigMap's gateway config (its autoscaler and admission sections as shipped; only the listen
address and the pool's replicas, static URLs of a simulated fleet instead of the headless Service,
differ), serves a little traffic, and its /metrics and the replicas' /metrics (the simulator mimics
vLLM's) are scraped. Each selector of every overlay's ScaledObject, HPA, PrometheusRule and
Grafana panel must match a scraped series: the name, and the label values it asks for (the pool
"chat" included), apart from the few series that appear only after a rare event."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from kvgate.gateway.telemetry.gauges import COORDINATION_SERIES, FORECAST_GAUGES
from kvgate.sim.fleet import SimFleet
from kvgate.sim.ports import free_ports
from tests.integration.processes import assert_process_idle, sdk_traffic, serving_process, stop
from tests.unit.test_deploy import OVERLAYS, base_gateway_config, queried_selectors, render, unmatched

RARE = frozenset(
    {
        # counted from the first 429, alerted on as a ratio: no series means no rejects
        ("kvgate_admission_decisions_total", "decision", "reject"),
        # published only while the policy is capped at max_replicas
        ("kvgate_autoscaler_decision_info", "reason", "max_replicas"),
    }
)
CONFIGURED_ONLY = frozenset(
    {*COORDINATION_SERIES, "kvgate_objective_requests_total", "kvgate_objective_seconds", *FORECAST_GAUGES}
)
"""Exported only when the config asks (coordination, latency objectives, the autoscaler's forecast),
which the base config does not: ``test_alert_metrics`` scrapes the first two from a gateway
configured with both; the forecast's appear once it has a season of history
(``tests/unit/test_metrics.py`` exports them)."""
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+\S+")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def series_of(exposition: str) -> dict[str, list[dict[str, str]]]:
    """The label sets of every sample in a Prometheus text exposition, by sample name."""
    series: dict[str, list[dict[str, str]]] = {}
    for line in exposition.splitlines():
        match = _SAMPLE.match(line)
        if match:
            series.setdefault(match.group(1), []).append(dict(_LABEL.findall(match.group(2) or "")))
    return series


async def scrape(http: aiohttp.ClientSession, urls: list[str]) -> dict[str, list[dict[str, str]]]:
    merged: dict[str, list[dict[str, str]]] = {}
    for url in urls:
        async with http.get(url + "/metrics") as response:
            assert response.status == 200, url
            for name, label_sets in series_of(await response.text()).items():
                merged.setdefault(name, []).extend(label_sets)
    return merged


def adapted(base: dict[str, Any], port: int, replica_urls: list[str]) -> dict[str, Any]:
    """The base config, listening on loopback and with the simulated replicas as each pool's."""
    config = orjson.loads(orjson.dumps(base))
    config["server"] = {**config["server"], "host": "127.0.0.1", "port": port, "drain_delay_s": 0}
    for pool in config["pools"]:
        pool.pop("dns")
        pool["replicas"] = replica_urls
    return config


def test_the_series_parser_reads_labels_and_colons() -> None:
    text = '# HELP x y\nvllm:num_requests_running{model_name="m",engine="0"} 3\nkvgate_up 1\n'
    assert series_of(text) == {
        "vllm:num_requests_running": [{"model_name": "m", "engine": "0"}],
        "kvgate_up": [{}],
    }


async def test_every_metric_the_manifests_query_is_exported_with_the_base_config(tmp_path: Path) -> None:
    base = base_gateway_config()
    selectors = [
        s
        for overlay in sorted(OVERLAYS)
        for s in queried_selectors(render(f"overlays/{overlay}"))
        if s.metric not in CONFIGURED_ONLY
    ]
    assert len({s.metric for s in selectors}) >= 15
    model = base["models"][0]["name"]
    async with SimFleet(replicas=2, model=model, time_scale=0.0) as fleet:
        port = free_ports()
        async with (
            serving_process(tmp_path, adapted(base, port, fleet.urls)) as (url, process),
            aiohttp.ClientSession() as http,
        ):
            await sdk_traffic(url, model, chats=8, stream_tokens=16)
            # the gateway scrapes the replicas on its own period: wait for their occupancy
            for _ in range(300):
                problems = unmatched(selectors, await scrape(http, [url, *fleet.urls]), RARE)
                if not problems:
                    break
                await asyncio.sleep(0.1)
            assert problems == [], "\n".join(problems)
            await assert_process_idle(url)
            assert await stop(process) == 0
