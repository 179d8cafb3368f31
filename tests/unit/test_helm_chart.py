"""deploy/helm/kvgate, rendered by Helm's own engine and validated as the kustomize overlays are
(tests/unit/test_deploy.py): Kubernetes schemas (strict), the custom resources against the schemas
of the fields used, the values against values.schema.json, every reference resolved, and the
gateway config it writes loaded as the pods load it. Helm is the one the ``dev`` extra installs
(``helm-python-sdk``: Helm's Go SDK as a library); without it the test fails, never skips."""

from __future__ import annotations

import json
from functools import cache
from pathlib import PurePosixPath
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from kvgate.config.gateway import GatewayConfig
from kvgate.config.loader import parse_config
from tests.unit.test_deploy import CUSTOM_SCHEMAS, DEPLOY, IMAGE, K8S_VERSION, named, no_old_key

CHART = DEPLOY / "helm" / "kvgate"
NAMESPACE = "inference"
CORE_KINDS = {
    "ConfigMap",
    "Deployment",
    "Service",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "HorizontalPodAutoscaler",
    "PodDisruptionBudget",
    "Ingress",
    "Secret",
}
HTTP_ROUTE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "gateway.networking.k8s.io/v1"},
        "spec": {
            "type": "object",
            "required": ["parentRefs", "rules"],
            "additionalProperties": False,
            "properties": {
                "parentRefs": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string"},
                            "namespace": {"type": "string"},
                            "sectionName": {"type": "string"},
                        },
                    },
                },
                "hostnames": {"type": "array", "items": {"type": "string"}},
                "rules": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "matches": {"type": "array"},
                            "backendRefs": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["name", "port"],
                                    "additionalProperties": False,
                                    "properties": {"name": {"type": "string"}, "port": {"type": "integer"}},
                                },
                            },
                            "timeouts": {
                                "type": "object",
                                "additionalProperties": False,
                                "properties": {
                                    "request": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"}
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}
SCHEMAS = {**CUSTOM_SCHEMAS, "HTTPRoute": HTTP_ROUTE_SCHEMA}

BRING_YOUR_OWN = {
    "vllm": {"enabled": False},
    "pool": {"discovery": "kubernetes", "kubernetes": {"selector": "app=vllm", "namespace": "models"}},
    "autoscaler": {"deployment": "llama"},
}
EVERYTHING = {
    "auth": {
        "enabled": True,
        "existingSecret": "kvgate-secrets",
        "observabilityTokenKey": "metrics-token",
        "tenants": [
            {"name": "assistant", "keysKey": "assistant-keys"},
            {"name": "batch", "keysKey": "batch-keys"},
        ],
    },
    "vllmApiKey": {"existingSecret": "vllm-api-key"},
    "coordination": {"redis": {"deploy": False}, "existingSecret": "redis"},
    "hpa": {"enabled": True},
    "httpRoute": {
        "enabled": True,
        "parentRefs": [{"name": "public", "namespace": "gateways"}],
        "hostnames": ["llm.example.com"],
    },
    "ingress": {"enabled": True, "className": "nginx", "host": "llm.example.com"},
    "monitoring": {
        "serviceMonitor": {"enabled": True},
        "podMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "dashboard": {"enabled": True},
    },
    "config": {
        "models": [{"name": "m", "max_model_len": 8192, "kv_bytes_per_token": 131072}],
        "admission": {"tenants": [{"name": "assistant", "priority": "critical"}]},
    },
}
CASES = {
    "default": {},
    "bring-your-own-selector": BRING_YOUR_OWN,
    "bring-your-own-dns": {
        "vllm": {"enabled": False},
        "pool": {"discovery": "dns", "dns": {"name": "vllm.models.svc"}},
    },
    "bring-your-own-static": {
        "vllm": {"enabled": False},
        "pool": {"discovery": "static", "static": ["http://10.0.0.5:8000", "http://10.0.0.6:8000"]},
    },
    "everything": EVERYTHING,
}


def _helm() -> Any:
    try:
        import helm_python
    except ImportError:
        pytest.fail("helm-python-sdk (Helm's engine for the chart tests) is not installed: make install")
    helm_python.disable_logging()
    return helm_python


@cache
def _render(values_json: str) -> tuple[dict[str, Any], ...]:
    helm = _helm()
    values = json.loads(values_json)
    with helm.Chart.load(str(CHART)) as chart:
        chart.validate_schema(values)
        manifests = chart.render(values, name="kvgate", namespace=NAMESPACE, is_install=True)
    docs = []
    for path, text in sorted(manifests.items()):
        if path.endswith(".yaml"):
            docs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return tuple(docs)


def render(values: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    return _render(json.dumps(values, sort_keys=True))


def gateway_config(docs: tuple[dict[str, Any], ...]) -> tuple[GatewayConfig, dict[str, Any]]:
    """The gateway pod's config as it loads it (secret files are checked to be mounted, not read)."""
    deployment = named(docs, "Deployment")["kvgate"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    path = PurePosixPath(container["args"][container["args"].index("--config") + 1])
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    mount = next(m for m in container["volumeMounts"] if PurePosixPath(m["mountPath"]) == path.parent)
    text = named(docs, "ConfigMap")[volumes[mount["name"]]["configMap"]["name"]]["data"][path.name]
    document = yaml.safe_load(text)
    config = parse_config(document, {}, f"chart:{path}", no_old_key, read_secrets=False)
    return config, deployment


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_chart_renders_and_validates(case: str) -> None:
    docs = render(CASES[case])
    for doc in docs:
        if doc["kind"] in CORE_KINDS:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        else:
            jsonschema.validate(doc, SCHEMAS[doc["kind"]])
        assert doc["metadata"].get("namespace", NAMESPACE) == NAMESPACE or doc["kind"] in {
            "Role",
            "RoleBinding",
        }


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_gateway_config_loads_and_every_secret_file_is_mounted(case: str) -> None:
    docs = render(CASES[case])
    config, deployment = gateway_config(docs)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == IMAGE
    mounts = [PurePosixPath(m["mountPath"]) for m in container["volumeMounts"]]
    files = [t.api_keys_file for t in config.auth.tenants] + [
        config.auth.admin_token_file,
        config.auth.observability_token_file,
        *(p.api_key_file for p in config.pools),
        config.coordination.redis_url_file if config.coordination is not None else None,
    ]
    for file in filter(None, files):
        assert PurePosixPath(file).parent in mounts, file


def test_every_reference_resolves() -> None:
    for case, values in CASES.items():
        docs = render(values)
        pods = {
            name: d["spec"]["template"]["metadata"]["labels"] for name, d in named(docs, "Deployment").items()
        }
        for name, service in named(docs, "Service").items():
            selector = service["spec"]["selector"]
            assert any(selector.items() <= labels.items() for labels in pods.values()), (case, name)
        for deployment in named(docs, "Deployment").values():
            spec = deployment["spec"]
            assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
            pod = spec["template"]["spec"]
            accounts = set(named(docs, "ServiceAccount")) | {"default"}
            assert pod.get("serviceAccountName", "default") in accounts
            config_maps = {v["configMap"]["name"] for v in pod.get("volumes", []) if "configMap" in v}
            assert config_maps <= set(named(docs, "ConfigMap")), case
        for binding in named(docs, "RoleBinding").values():
            assert binding["roleRef"]["name"] in named(docs, "Role")
            assert {s["name"] for s in binding["subjects"]} <= set(named(docs, "ServiceAccount"))


def test_bring_your_own_points_at_the_fleet_and_deploys_no_vllm() -> None:
    docs = render(BRING_YOUR_OWN)
    assert "kvgate-vllm" not in named(docs, "Deployment")
    config, _ = gateway_config(docs)
    kubernetes = config.pools[0].kubernetes
    assert kubernetes is not None and (kubernetes.selector, kubernetes.namespace) == ("app=vllm", "models")
    role = named(docs, "Role")["kvgate-discovery"]
    assert role["metadata"]["namespace"] == "models"
    autoscaler = named(docs, "Deployment")["kvgate-autoscaler"]["spec"]["template"]["spec"]["containers"][0]
    assert "--deployment=chat=llama" in autoscaler["args"]
    assert named(docs, "Role")["kvgate-autoscaler"]["rules"][0]["resourceNames"] == ["llama"]
    static = render(CASES["bring-your-own-static"])
    assert gateway_config(static)[0].pools[0].replicas == ("http://10.0.0.5:8000", "http://10.0.0.6:8000")
    assert "kvgate-autoscaler" not in named(static, "Deployment"), "no Deployment to scale: no loop"


def test_bring_your_own_without_saying_where_fails_with_the_reason() -> None:
    helm = _helm()
    with helm.Chart.load(str(CHART)) as chart, pytest.raises(helm.HelmError, match=r"pool\.discovery"):
        chart.render({"vllm": {"enabled": False}}, name="kvgate", namespace=NAMESPACE)


def test_the_schema_refuses_a_wrong_value() -> None:
    helm = _helm()
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.validate(yaml.safe_load((CHART / "values.yaml").read_text()), schema)
    for bad in ({"pool": {"discovery": "consul"}}, {"replicaCount": 0}, {"ingress": {"enabeld": True}}):
        with helm.Chart.load(str(CHART)) as chart, pytest.raises(helm.HelmError):
            chart.validate_schema(bad)


def test_the_toggles_reuse_the_rules_and_dashboard_of_deploy_monitoring() -> None:
    docs = render(EVERYTHING)
    rule = named(docs, "PrometheusRule")["kvgate"]
    shipped = yaml.safe_load((DEPLOY / "monitoring" / "prometheusrule.yaml").read_text())
    assert rule["spec"] == shipped["spec"]
    dashboard = named(docs, "ConfigMap")["kvgate-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["kvgate.json"]) == json.loads(
        (DEPLOY / "monitoring" / "grafana-dashboard.json").read_text()
    )
    kinds = {d["kind"] for d in docs}
    assert {"ServiceMonitor", "PodMonitor", "HorizontalPodAutoscaler", "HTTPRoute", "Ingress"} <= kinds
    assert "replicas" not in named(docs, "Deployment")["kvgate"]["spec"], (
        "the HPA owns the gateway's replicas"
    )
    assert not {"ServiceMonitor", "PodMonitor", "PrometheusRule", "HTTPRoute", "Ingress"} & {
        d["kind"] for d in render({})
    }


def test_gateway_pods_spread_and_keep_one_through_disruptions() -> None:
    docs = render({})
    pod = named(docs, "Deployment")["kvgate"]["spec"]["template"]["spec"]
    keys = {c["topologyKey"] for c in pod["topologySpreadConstraints"]}
    assert keys == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}
    assert named(docs, "PodDisruptionBudget")["kvgate"]["spec"]["minAvailable"] == 1
    config, _ = gateway_config(docs)
    server = config.server
    assert server.drain_delay_s + server.drain_timeout_s < pod["terminationGracePeriodSeconds"]


def test_vllm_pods_drain_their_longest_stream_before_they_stop() -> None:
    docs = render({})
    config, _ = gateway_config(docs)
    vllm = named(docs, "Deployment")["kvgate-vllm"]["spec"]["template"]
    container = vllm["spec"]["containers"][0]
    timeout_s = int(next(a for a in container["args"] if a.startswith("--shutdown-timeout=")).split("=")[1])
    pre_stop_s = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert timeout_s >= config.server.timeouts.first_byte_s, "a non-streamed request's whole generation fits"
    assert vllm["spec"]["terminationGracePeriodSeconds"] > pre_stop_s + timeout_s
    assert container["image"].startswith("vllm/vllm-openai:v0.32")
    service = named(docs, "Service")["kvgate-vllm"]
    assert service["spec"]["selector"]["kvgate.io/routable"] == "true"
    assert (
        "kvgate.io/routable"
        not in named(docs, "Deployment")["kvgate-vllm"]["spec"]["selector"]["matchLabels"]
    )
    assert config.pools[0].kubernetes is not None and config.pools[0].kubernetes.service == "kvgate-vllm"


def test_the_chart_lints_clean() -> None:
    helm = _helm()
    result = helm.lint(str(CHART), strict=True, namespace=NAMESPACE)
    assert result["total_charts_linted"] == 1 and not result["errors"], result
    warnings = [m for m in result["messages"] if m["severity"] >= 2]  # Helm's levels: 1 info, 2 warning
    assert not warnings, warnings


def test_the_autoscaler_runs_with_arguments_kvgate_autoscale_takes() -> None:
    from kvgate.cli import build_parser

    docs = render({})
    container = named(docs, "Deployment")["kvgate-autoscaler"]["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(container["args"])
    assert (args.actuator, args.namespace, args.deployment) == ("kubernetes", NAMESPACE, ["chat=kvgate-vllm"])
    assert args.drain_timeout_s == 600 and args.gateway_dns == ["http://kvgate-pods.inference.svc:8080"]
    rules = named(docs, "Role")["kvgate-autoscaler"]["rules"]
    assert {"get", "list", "patch"} <= set(next(r for r in rules if r["resources"] == ["pods"])["verbs"])


def test_the_chart_is_documented_for_a_newcomer() -> None:
    text = (DEPLOY.parent / "docs" / "deploy.md").read_text()
    assert "helm install kvgate deploy/helm/kvgate" in text
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for key in ("vllm", "pool", "auth", "monitoring", "autoscaler", "httpRoute", "ingress"):
        assert (key in values and f"{key}:" in text) or f"`{key}." in text, key


def test_the_autoscaler_reads_the_gateways_admin_routes_with_the_gateways_token() -> None:
    """Without a token /admin/* answers loopback clients only, and the drain before a scale-in reads
    each gateway's replicas there: the chart generates one when no Secret names it."""
    for values in ({}, EVERYTHING):
        docs = render(values)
        config, _ = gateway_config(docs)
        token_dir = PurePosixPath(str(config.auth.admin_token_file)).parent
        autoscaler = named(docs, "Deployment")["kvgate-autoscaler"]["spec"]["template"]["spec"]
        mounts = {PurePosixPath(m["mountPath"]) for m in autoscaler["containers"][0]["volumeMounts"]}
        assert token_dir in mounts
    assert "kvgate-admin" in named(render({}), "Secret")
    assert "kvgate-admin" not in named(render({"auth": {"existingSecret": "mine"}}), "Secret")
