"""Offline checks of deploy/: schemas, Kustomize references, embedded configs, metric names in PromQL."""

from __future__ import annotations

import argparse
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from config.loader import parse_config
from gateway.autoscale_loop import register
from tests.unit.test_metrics import populated, samples

DEPLOY = Path(__file__).parents[2] / "deploy"
K8S_VERSION = "1.30"
CORE_KINDS = {
    "ConfigMap",
    "Deployment",
    "Service",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "HorizontalPodAutoscaler",
}
OVERLAYS = {
    "keda": {"ScaledObject", "PrometheusRule"},
    "hpa": {"HorizontalPodAutoscaler", "PrometheusRule"},
    "kvgate-loop": {"Role", "RoleBinding", "ServiceAccount", "PrometheusRule"},
    "sidecar": set(),
}

_BEHAVIOR_RULES = {
    "type": "object",
    "properties": {
        "stabilizationWindowSeconds": {"type": "integer", "minimum": 0, "maximum": 3600},
        "selectPolicy": {"enum": ["Max", "Min", "Disabled"]},
        "policies": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["type", "value", "periodSeconds"],
                "additionalProperties": False,
                "properties": {
                    "type": {"enum": ["Pods", "Percent"]},
                    "value": {"type": "integer", "minimum": 1},
                    "periodSeconds": {"type": "integer", "minimum": 1, "maximum": 1800},
                },
            },
        },
    },
    "additionalProperties": False,
}
SCALED_OBJECT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {"name": {"type": "string"}, "kind": {"type": "string"}},
                    "additionalProperties": False,
                },
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "advanced": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "behavior": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {"scaleUp": _BEHAVIOR_RULES, "scaleDown": _BEHAVIOR_RULES},
                                }
                            },
                        }
                    },
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "additionalProperties": False,
                        "properties": {
                            "type": {"const": "prometheus"},
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "metadata": {
                                "type": "object",
                                "required": ["serverAddress", "query", "threshold"],
                                "additionalProperties": {"type": "string"},
                                "properties": {"threshold": {"type": "string", "pattern": r"^[0-9.]+$"}},
                            },
                        },
                    },
                },
            },
        },
    },
}
PROMETHEUS_RULE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "spec": {
            "type": "object",
            "required": ["groups"],
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string"},
                            "rules": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["expr"],
                                    "additionalProperties": False,
                                    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                                    "properties": {
                                        "alert": {"type": "string", "pattern": "^[A-Za-z][A-Za-z0-9_]*$"},
                                        "record": {"type": "string", "pattern": "^[a-zA-Z_:][a-zA-Z0-9_:]*$"},
                                        "expr": {"type": "string", "minLength": 1},
                                        "for": {"type": "string", "pattern": "^[0-9]+[smh]$"},
                                        "labels": {
                                            "type": "object",
                                            "additionalProperties": {"type": "string"},
                                        },
                                        "annotations": {
                                            "type": "object",
                                            "additionalProperties": {"type": "string"},
                                        },
                                    },
                                },
                            },
                        },
                    },
                }
            },
        },
    },
}
CUSTOM_SCHEMAS = {"ScaledObject": SCALED_OBJECT_SCHEMA, "PrometheusRule": PROMETHEUS_RULE_SCHEMA}


def manifests() -> list[tuple[Path, dict[str, Any]]]:
    out: list[tuple[Path, dict[str, Any]]] = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        out.extend((path, doc) for doc in yaml.safe_load_all(path.read_text()) if doc)
    return out


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """The documents a Kustomization directory produces (resources, recursively, and generated
    ConfigMaps), checking that every reference resolves. Enough for these manifests: no patches."""
    k = yaml.safe_load((directory / "kustomization.yaml").read_text())
    assert k["kind"] == "Kustomization"
    docs: list[dict[str, Any]] = []
    for ref in k.get("resources", []):
        target = (directory / ref).resolve()
        assert target.exists(), f"{directory}: resource {ref} does not exist"
        if target.is_dir():
            docs.extend(kustomize(target))
        else:
            docs.extend(d for d in yaml.safe_load_all(target.read_text()) if d)
    for generator in k.get("configMapGenerator", []):
        data = {}
        for name in generator["files"]:
            assert (directory / name).is_file(), f"{directory}: generator file {name} does not exist"
            data[Path(name).name] = (directory / name).read_text()
        docs.append(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": generator["name"]}, "data": data}
        )
    return docs


@cache
def exported_series() -> frozenset[str]:
    return frozenset(samples(populated()))


def test_core_kinds_validate_against_kubernetes_schemas() -> None:
    checked = 0
    for _, doc in manifests():
        if doc["kind"] in CORE_KINDS:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
            checked += 1
    assert checked >= 12, checked


@pytest.mark.parametrize("kind", sorted(CUSTOM_SCHEMAS))
def test_custom_resources_validate_against_the_fields_we_use(kind: str) -> None:
    docs = [doc for _, doc in manifests() if doc["kind"] == kind]
    assert docs
    for doc in docs:
        jsonschema.validate(doc, CUSTOM_SCHEMAS[kind])


def test_kubernetes_schemas_reject_a_misspelt_field() -> None:
    doc = next(doc for _, doc in manifests() if doc["kind"] == "Deployment")
    bad = json.loads(json.dumps(doc))
    container = bad["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe", {})
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_custom_schemas_reject_a_misspelt_field() -> None:
    doc = next(doc for _, doc in manifests() if doc["kind"] == "ScaledObject")
    bad = json.loads(json.dumps(doc))
    bad["spec"]["triggers"][0]["metadata"]["thresold"] = bad["spec"]["triggers"][0]["metadata"].pop(
        "threshold"
    )
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCALED_OBJECT_SCHEMA)


def test_every_manifest_kind_is_checked() -> None:
    kinds = {doc["kind"] for _, doc in manifests()}
    assert kinds <= CORE_KINDS | set(CUSTOM_SCHEMAS), kinds - CORE_KINDS - set(CUSTOM_SCHEMAS)


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_overlays_resolve_and_targets_exist(overlay: str) -> None:
    docs = kustomize(DEPLOY / "overlays" / overlay)
    kinds = {d["kind"] for d in docs}
    assert OVERLAYS[overlay] <= kinds
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    for d in docs:
        if d["kind"] in ("ScaledObject", "HorizontalPodAutoscaler"):
            assert d["spec"]["scaleTargetRef"]["name"] in deployments
        if d["kind"] == "Service":
            selector = d["spec"]["selector"]
            assert any(
                selector.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
                for dep in deployments.values()
            ), d["metadata"]["name"]
    config_maps = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    for dep in deployments.values():
        for volume in dep["spec"]["template"]["spec"].get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps


def test_overlays_use_one_scaler_each() -> None:
    scalers = {
        name: {d["kind"] for d in kustomize(DEPLOY / "overlays" / name)}
        & {"ScaledObject", "HorizontalPodAutoscaler"}
        for name in OVERLAYS
    }
    assert all(len(kinds) <= 1 for kinds in scalers.values()), scalers


def test_embedded_gateway_configs_are_valid() -> None:
    configs = [
        (path, doc)
        for path, doc in manifests()
        if doc["kind"] == "ConfigMap" and "kvgate.yaml" in doc["data"]
    ]
    assert len(configs) == 2
    for path, doc in configs:
        config = parse_config(yaml.safe_load(doc["data"]["kvgate.yaml"]), environ={}, source=str(path))
        assert config.pools


def test_autoscaler_deployment_arguments_parse() -> None:
    deployment = next(
        doc
        for _, doc in manifests()
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] == "kvgate-autoscaler"
    )
    argv = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    parser = argparse.ArgumentParser(prog="kvgate")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    assert args.actuator == "kubernetes"
    assert sorted(args.deployment) == ["decode=vllm-decode", "prefill=vllm-prefill"]


def metric_names_in(text: str) -> set[str]:
    return set(re.findall(r"\bkvgate_[a-z0-9_]+\b", text))


def test_promql_names_only_metrics_kvgate_exports() -> None:
    files = [p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".json")]
    referenced: set[str] = set()
    for path in files:
        names = metric_names_in(path.read_text())
        unknown = names - exported_series()
        assert not unknown, f"{path.relative_to(DEPLOY)} names {sorted(unknown)}, not exported by kvgate"
        referenced |= names
    assert {
        "kvgate_autoscaler_desired_replicas",
        "kvgate_pool_kv_occupancy_ratio",
        "kvgate_time_to_first_token_seconds_bucket",
        "kvgate_admission_decisions_total",
    } <= referenced


def test_name_check_catches_an_unknown_metric() -> None:
    assert metric_names_in('rate(kvgate_ttft_bucket{pool="a"}[1m])') - exported_series() == {
        "kvgate_ttft_bucket"
    }


def test_dashboard_panels_all_query_prometheus() -> None:
    dashboard = json.loads((DEPLOY / "monitoring" / "grafana-dashboard.json").read_text())
    assert dashboard["uid"] == "kvgate-overview"
    titles = [p["title"] for p in dashboard["panels"]]
    assert len(set(titles)) == len(titles)
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        assert all(metric_names_in(t["expr"]) for t in panel["targets"]), panel["title"]
