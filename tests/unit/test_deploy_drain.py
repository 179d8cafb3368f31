"""A vLLM pod of deploy/ drains before it stops: a current vLLM with --shutdown-timeout as long as
the longest request the gateway lets run, a preStop that keeps it serving while its removal reaches
the gateways, and a grace period that covers both; in the sidecar overlay, vLLM outlives the drain
of the kvgate beside it."""

from __future__ import annotations

from typing import Any

import pytest

from kvgate.config.gateway import GatewayConfig
from tests.unit.test_deploy import containers, gateway_configs, render

VLLM_IMAGE = "vllm/vllm-openai:v0.32.0"
OVERLAYS = ("hpa", "pd", "sidecar")


def shutdown_timeout_s(container: dict[str, Any]) -> int:
    args = [str(a) for a in container["args"]]
    joined = [a.split("=", 1)[1] for a in args if a.startswith("--shutdown-timeout=")]
    spaced = [args[i + 1] for i, a in enumerate(args) if a == "--shutdown-timeout"]
    (value,) = joined + spaced
    return int(value)


def pre_stop_s(container: dict[str, Any]) -> int:
    pre_stop = container["lifecycle"]["preStop"]
    return int(pre_stop["sleep"]["seconds"])


def vllm_pods(overlay: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    pods = [(d, c) for d, c in containers(render(f"overlays/{overlay}")) if c["image"].startswith("vllm/")]
    assert pods, overlay
    return pods


def longest_request_s(config: GatewayConfig) -> float:
    """The longest a request sent to a replica may run: a non-streamed one's whole generation."""
    return config.server.timeouts.first_byte_s


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_vllm_pods_drain_the_longest_request_before_they_stop(overlay: str) -> None:
    configs = gateway_configs(render(f"overlays/{overlay}"))
    longest_s = max(longest_request_s(c) for c in configs)
    for deployment, container in vllm_pods(overlay):
        assert container["image"] == VLLM_IMAGE
        timeout_s, delay_s = shutdown_timeout_s(container), pre_stop_s(container)
        grace_s = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert timeout_s >= longest_s, (deployment["metadata"]["name"], timeout_s, longest_s)
        assert grace_s > delay_s + timeout_s, (deployment["metadata"]["name"], grace_s)
        if overlay != "sidecar":  # its gateway is in the pod (the test below)
            assert delay_s >= 10, "not-ready must reach the gateways (DNS refresh, probes) before SIGTERM"


def test_the_sidecars_vllm_outlives_the_drain_of_the_kvgate_beside_it() -> None:
    docs = render("overlays/sidecar")
    (config,) = gateway_configs(docs)
    (deployment, vllm), *_ = vllm_pods("sidecar")
    server = config.server
    assert pre_stop_s(vllm) >= server.drain_delay_s, "vLLM still takes what kvgate accepts during its delay"
    assert pre_stop_s(vllm) + shutdown_timeout_s(vllm) >= server.drain_delay_s + server.drain_timeout_s
    grace_s = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace_s > pre_stop_s(vllm) + shutdown_timeout_s(vllm)
    assert grace_s > server.drain_delay_s + server.drain_timeout_s
