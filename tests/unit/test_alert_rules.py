"""The alert rules parse, carry a severity and a runbook that exists, burn the configured objectives'
error budgets instead of comparing latency with a fixed number, cover coordination and missing
gateway pods; the dashboard's panels aggregate across gateway pods."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from tests.unit.test_deploy import selectors_in

ROOT = Path(__file__).parents[2]
RULES = ROOT / "deploy" / "monitoring" / "prometheusrule.yaml"
DASHBOARD = ROOT / "deploy" / "monitoring" / "grafana-dashboard.json"
RUNBOOKS = ROOT / "docs" / "runbooks.md"


def alerts() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    assert doc["kind"] == "PrometheusRule"
    return [rule for group in doc["spec"]["groups"] for rule in group["rules"] if "alert" in rule]


def anchors() -> set[str]:
    """GitHub's anchors of the runbooks' headings: lower case, spaces to dashes, punctuation out."""
    headings = re.findall(r"^#+ (.+)$", RUNBOOKS.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}


def test_every_alert_has_a_severity_and_a_runbook_section_that_exists() -> None:
    known = anchors()
    for alert in alerts():
        assert alert["labels"]["severity"] in {"critical", "warning"}, alert["alert"]
        url = alert["annotations"]["runbook_url"]
        page, _, anchor = url.partition("#")
        assert page == "docs/runbooks.md" and anchor in known, (alert["alert"], url)
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]


def test_latency_alerts_burn_the_configured_objectives_budget_not_a_fixed_threshold() -> None:
    rules = {a["alert"]: a for a in alerts()}
    for objective in ("TTFT", "ITL"):
        fast, slow = rules[f"Kvgate{objective}BudgetBurnFast"], rules[f"Kvgate{objective}BudgetBurnSlow"]
        assert (fast["labels"]["severity"], slow["labels"]["severity"]) == ("critical", "warning")
        for rule, windows in ((fast, ("1h", "5m")), (slow, ("6h", "30m"))):
            expr = rule["expr"]
            assert f'objective="{objective.lower()}"' in expr and 'outcome="missed"' in expr
            assert all(f"[{w}]" in expr for w in windows), "two windows: long to be sure, short to reset"
            assert "(1 - 0.99)" in expr
    for alert in alerts():
        assert "kvgate_time_to_first_token_seconds" not in alert["expr"], alert["alert"]
        assert "kvgate_inter_token_latency_seconds" not in alert["expr"], alert["alert"]


def test_coordination_down_and_missing_gateway_pods_are_alerted() -> None:
    rules = {a["alert"]: a for a in alerts()}
    assert "kvgate_coordination_up" in rules["KvgateCoordinationDown"]["expr"]
    assert rules["KvgateCoordinationDown"]["labels"]["severity"] == "critical"
    missing = rules["KvgateGatewayPodMissing"]["expr"]
    assert "kube_deployment_status_replicas_available" in missing and 'deployment="kvgate"' in missing
    assert 'up{job="kvgate"}' in rules["KvgateGatewayPodNotScraped"]["expr"]


_AGGREGATED = re.compile(r"^\s*(?:sum|max|min|avg|count)\b|^\s*histogram_quantile\(\s*[\d.]+\s*,\s*sum\b")


def test_dashboard_panels_aggregate_across_gateway_pods() -> None:
    """With N gateway pods each exporting its own series, a panel shows one line per pool (or
    model, replica) only when it aggregates; the process panels are per pod on purpose."""
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            if "process_" in expr:
                continue
            assert _AGGREGATED.match(expr), (panel["title"], expr)
            assert selectors_in(panel["title"], expr)
    titles = {p["title"] for p in dashboard["panels"]}
    assert any("Objective misses" in t for t in titles)
    assert any("Gateway pods" in t for t in titles)
