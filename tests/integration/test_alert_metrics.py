"""Every kvgate and vLLM metric the alert rules and the dashboard query is exported by a gateway
configured as the alerts assume (latency objectives, Redis coordination) in front of the simulator,
after streams met and missed their objectives: the burn-rate series count both outcomes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import yaml

from kvgate.gateway.edge.server import running_gateway
from kvgate.gateway.telemetry.gauges import FORECAST_GAUGES
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, gateway_config
from tests.integration.test_deploy_metrics import RARE, series_of
from tests.unit.test_deploy import Selector, selectors_in, unmatched

MONITORING = Path(__file__).parents[2] / "deploy" / "monitoring"
RARE_HERE = RARE | {
    ("kvgate_autoscaler_decision_info", "reason", "max_replicas"),
    ("kvgate_pool_kv_occupancy_ratio", "source", "scraped"),
}


COUNTED = r'^kvgate_objective_requests_total\{[^}]*objective="(\w+)",outcome="(\w+)"[^}]*\} (\S+)$'


def queried() -> list[Selector]:
    rules = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    found = [
        s
        for group in rules["spec"]["groups"]
        for rule in group["rules"]
        for s in selectors_in(rule.get("alert") or rule["record"], rule["expr"])
    ]
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            found += selectors_in(panel["title"], target["expr"])
    return found


async def test_rules_and_panels_query_series_a_configured_gateway_exports(redis_url: str) -> None:
    async with SimFleet(replicas=1, time_scale=0.0, seed=0, overrides={"warmup_s": 0}) as fleet:
        pool = {"name": "chat", "replicas": fleet.urls}
        config = gateway_config(
            fleet.urls,
            pools=[pool],
            admission={"models": {MODEL: {"ttft_slo_s": 30.0, "itl_slo_s": 1e-9}}},
            coordination={"redis_url": redis_url, "namespace": "alert-metrics", "interval_s": 0.05},
            autoscaler={"policy": {"min_replicas": 1, "max_replicas": 2}},
        )
        async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            body = {"model": MODEL, "prompt": "count", "max_tokens": 16, "ignore_eos": True, "stream": True}
            for _ in range(3):
                assert (await http.post("/v1/completions", json=body)).status_code == 200
            await assert_idle(gw)
            own = (await http.get(gw.url + "/metrics")).text
            series: dict[str, list[dict[str, str]]] = {}
            for url in (gw.url, *fleet.urls):
                for name, labels in series_of((await http.get(url + "/metrics")).text).items():
                    series.setdefault(name, []).extend(labels)
    # The forecast's series appear once it has a season of history (tests/unit/test_metrics.py).
    selectors = [
        s for s in queried() if not s.metric.startswith("process_") and s.metric not in FORECAST_GAUGES
    ]
    assert unmatched(selectors, series, RARE_HERE) == []
    counted = {
        (objective, outcome): float(value) for objective, outcome, value in re.findall(COUNTED, own, re.M)
    }
    assert counted == {
        ("ttft", "met"): 3.0,
        ("ttft", "missed"): 0.0,
        ("itl", "met"): 0.0,
        ("itl", "missed"): 3.0,
    }
    objectives = {(x["model"], x["objective"]) for x in series["kvgate_objective_seconds"]}
    assert objectives == {(MODEL, "ttft"), (MODEL, "itl")}
