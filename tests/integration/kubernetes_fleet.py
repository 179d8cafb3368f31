"""A stand-in for the Kubernetes API server in front of a simulated fleet: a real HTTP server on
loopback that answers the paths the autoscaler and the gateways use (a Deployment and its scale,
its pods, their EndpointSlices) and plays the controllers' part over the simulator's control API.

Each simulated replica is one pod (IP 127.0.0.1, its own container port). The fleet's Service selects
``app=vllm`` and ``kvgate.io/routable=true``; the Deployment selects ``app=vllm`` alone. A scale
patch deletes pods as a ReplicaSet does: lowest ``controller.kubernetes.io/pod-deletion-cost``
first, then the newest; a deleted pod leaves the EndpointSlices at once and its replica gets what
SIGTERM gives a pod: it drains (refuses new connections, lets requests in flight finish, as vLLM's
``--shutdown-timeout`` does) for ``grace_s``, the pod's grace period, and is then killed with
whatever it still serves (SIGKILL), so a stream longer than the grace period is cut."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from tests.integration.processes import serving_app

SELECTOR = {"app": "vllm"}
ROUTABLE = "kvgate.io/routable"
COST = "controller.kubernetes.io/pod-deletion-cost"


@dataclass
class FleetCluster:
    control_url: str
    namespace: str = "inference"
    deployment: str = "vllm"
    service: str = "vllm"
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    replica_ids: dict[str, int] = field(default_factory=dict)
    replicas: int = 0
    deleted: list[str] = field(default_factory=list)
    removals: list[asyncio.Task[None]] = field(default_factory=list)
    grace_s: float = 0.2

    async def adopt(self, session: aiohttp.ClientSession) -> None:
        """One pod per live simulated replica."""
        async with session.get(f"{self.control_url}/replicas") as response:
            live = (await response.json())["replicas"]
        for replica in live:
            port = urlsplit(replica["url"]).port
            name = f"vllm-{replica['id']}"
            self.replica_ids[name] = int(replica["id"])
            self.pods[name] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": self.namespace,
                    "labels": {**SELECTOR, ROUTABLE: "true"},
                    "annotations": {},
                    "creationTimestamp": f"2026-01-01T00:00:{int(replica['id']):02d}Z",
                },
                "spec": {
                    "containers": [{"name": "vllm", "ports": [{"name": "http", "containerPort": port}]}]
                },
                "status": {"phase": "Running", "podIP": "127.0.0.1"},
            }
        self.replicas = len(self.pods)

    def url_of(self, name: str) -> str:
        pod = self.pods[name]
        return f"http://127.0.0.1:{pod['spec']['containers'][0]['ports'][0]['containerPort']}"

    def scale_to(self, replicas: int, session: aiohttp.ClientSession) -> None:
        self.replicas = replicas
        while len(self.pods) > replicas:

            def order(name: str) -> tuple[int, str]:
                cost = int(self.pods[name]["metadata"]["annotations"].get(COST, "0"))
                return cost, "".join(
                    chr(0x10FFFF - ord(c)) for c in self.pods[name]["metadata"]["creationTimestamp"]
                )

            victim = min(self.pods, key=order)
            del self.pods[victim]
            self.deleted.append(victim)
            self.removals.append(asyncio.create_task(self._remove(session, self.replica_ids[victim])))

    async def _remove(self, session: aiohttp.ClientSession, replica_id: int) -> None:
        base = f"{self.control_url}/replicas/{replica_id}"
        try:
            async with session.post(
                f"{base}/drain", timeout=aiohttp.ClientTimeout(total=self.grace_s)
            ) as response:
                response.raise_for_status()
        except TimeoutError:
            async with session.post(f"{base}/kill") as response:
                response.raise_for_status()
        async with session.delete(base) as response:
            response.raise_for_status()

    def deployment_doc(self) -> dict[str, Any]:
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": self.deployment, "namespace": self.namespace},
            "spec": {
                "replicas": self.replicas,
                "selector": {"matchLabels": SELECTOR},
                "template": {
                    "metadata": {"labels": {**SELECTOR, ROUTABLE: "true"}},
                    "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.32.0"}]},
                },
            },
        }

    def scale_doc(self) -> dict[str, Any]:
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {"name": self.deployment, "namespace": self.namespace},
            "spec": {"replicas": self.replicas},
            "status": {"replicas": len(self.pods)},
        }

    def endpoint_slices(self) -> dict[str, Any]:
        items = []
        for name, pod in sorted(self.pods.items()):
            if pod["metadata"]["labels"].get(ROUTABLE) != "true":
                continue
            port = pod["spec"]["containers"][0]["ports"][0]["containerPort"]
            items.append(
                {
                    "metadata": {"name": name, "labels": {"kubernetes.io/service-name": self.service}},
                    "addressType": "IPv4",
                    "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
                    "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}],
                }
            )
        return {"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1", "items": items}


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value


@asynccontextmanager
async def fleet_api(cluster: FleetCluster, session: aiohttp.ClientSession) -> AsyncIterator[str]:
    prefix = f"/apis/apps/v1/namespaces/{cluster.namespace}/deployments/{cluster.deployment}"

    async def deployment(_: web.Request) -> web.Response:
        return web.json_response(cluster.deployment_doc())

    async def scale(request: web.Request) -> web.Response:
        if request.method == "PATCH":
            cluster.scale_to(int((await request.json())["spec"]["replicas"]), session)
        return web.json_response(cluster.scale_doc())

    async def pods(request: web.Request) -> web.Response:
        wanted = dict(t.split("=", 1) for t in request.query.get("labelSelector", "").split(",") if t)
        items = [p for p in cluster.pods.values() if wanted.items() <= p["metadata"]["labels"].items()]
        return web.json_response({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})

    async def pod(request: web.Request) -> web.Response:
        found = cluster.pods.get(request.match_info["name"])
        if found is None:
            return web.json_response({"kind": "Status", "message": "not found", "code": 404}, status=404)
        _merge(found, await request.json())
        return web.json_response(found)

    async def slices(_: web.Request) -> web.Response:
        return web.json_response(cluster.endpoint_slices())

    app = web.Application()
    app.router.add_get(prefix, deployment)
    app.router.add_route("*", prefix + "/scale", scale)
    app.router.add_get(f"/api/v1/namespaces/{cluster.namespace}/pods", pods)
    app.router.add_patch(f"/api/v1/namespaces/{cluster.namespace}/pods/{{name}}", pod)
    app.router.add_get(f"/apis/discovery.k8s.io/v1/namespaces/{cluster.namespace}/endpointslices", slices)
    async with serving_app(app) as url:
        yield url
