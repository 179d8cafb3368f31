"""An existing fleet found through the Kubernetes API: a gateway whose pool is the ready endpoints
of EndpointSlices matching a label selector, read from a stand-in API server on loopback, in front
of simulated replicas; and a DNS pool naming a ClusterIP Service refused with the reason."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import httpx

from kvgate.config.pools import DnsReplicas
from kvgate.gateway.edge.server import running_gateway
from kvgate.gateway.replicas.discovery import DnsDiscovery
from kvgate.gateway.replicas.kubernetes import KubernetesApi
from kvgate.gateway.state import GatewayState
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config
from tests.integration.kubernetes_api import TOKEN, FakeCluster, api_server

LABELS = {"app.kubernetes.io/name": "vllm", "kvgate.io/pool": "chat"}


async def test_a_pool_is_the_ready_endpoints_of_the_endpoint_slices_its_selector_matches(
    tmp_path: Path,
) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    cluster = FakeCluster()
    async with SimFleet(replicas=3, time_scale=0.0) as fleet, api_server(cluster) as api_url:
        first, second, third = fleet.urls
        cluster.add_replicas("inference", LABELS, [first, second])
        cluster.add_replicas("inference", LABELS, [third], ready=False)
        cluster.add_replicas("inference", {"app.kubernetes.io/name": "other"}, ["http://127.0.0.1:1"])
        pool = {
            "name": "chat",
            "kubernetes": {
                "selector": "app.kubernetes.io/name=vllm",
                "namespace": "inference",
                "port": "http",
                "refresh_s": 0.05,
                "api_url": api_url,
                "token_file": str(token),
            },
            "kv_capacity_tokens": 450000,
        }
        async with running_gateway(gateway_config([], pools=[pool])) as gw:

            def urls() -> set[str]:
                return {r.url for r in gw.state.replicas.values()}

            assert urls() == {first, second}
            assert cluster.requests[0].startswith(
                "/apis/discovery.k8s.io/v1/namespaces/inference/endpointslices?labelSelector=app.kubernetes.io"
            )
            async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
                answer = await http.post(
                    "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 4}
                )
            assert answer.status_code == 200, answer.text
            cluster.set_ready("inference", int(third.rsplit(":", 1)[1]), True)
            assert await eventually(lambda: urls() == {first, second, third}), urls()
            cluster.set_ready("inference", int(first.rsplit(":", 1)[1]), False)
            assert await eventually(lambda: urls() == {second, third}), urls()
            await assert_idle(gw)


async def test_a_dns_pool_naming_a_clusterip_service_is_refused_with_the_reason(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    cluster = FakeCluster()
    cluster.services[("inference", "vllm")] = {"kind": "Service", "spec": {"clusterIP": "10.96.0.7"}}
    cluster.services[("inference", "vllm-headless")] = {"kind": "Service", "spec": {"clusterIP": "None"}}
    config = gateway_config(["http://127.0.0.1:9"])
    async with api_server(cluster) as api_url, aiohttp.ClientSession() as session:
        api = KubernetesApi(api_url, str(token), str(tmp_path / "ca.crt"))
        state = GatewayState.from_config(config)
        dns = DnsReplicas(name="vllm.inference.svc.cluster.local", port=8000)
        refused = DnsDiscovery(state, "default", dns, session, api)
        await refused.refresh()
        assert refused.refused is not None
        assert "ClusterIP Service inference/vllm (clusterIP 10.96.0.7)" in refused.refused
        assert "would count as one replica" in refused.refused
        assert "kubernetes: {service: vllm, namespace: inference}" in refused.refused
        assert not state.replicas
        headless = DnsDiscovery(
            state, "default", DnsReplicas(name="vllm-headless.inference.svc"), session, api
        )
        await headless.refresh()
        assert headless.refused is None
