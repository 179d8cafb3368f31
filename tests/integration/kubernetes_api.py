"""A stand-in for the Kubernetes API server on loopback: a real HTTP server answering the paths
kvgate reads (EndpointSlices by label selector, a Service by name) from objects a test sets, and
refusing a request without the expected bearer token as the API server does (401)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from tests.integration.processes import serving_app

TOKEN = "service-account-token"


@dataclass
class FakeCluster:
    """What the API server holds: EndpointSlices (each with its labels) and Services, by namespace."""

    slices: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    services: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)

    def add_replicas(
        self, namespace: str, labels: dict[str, str], urls: list[str], ready: bool = True
    ) -> None:
        """One EndpointSlice per replica URL (each has its own port, as simulated replicas do)."""
        for url in urls:
            parts = urlsplit(url)
            self.slices.setdefault(namespace, []).append(
                {
                    "metadata": {"name": f"vllm-{parts.port}", "labels": dict(labels)},
                    "addressType": "IPv4",
                    "ports": [{"name": "http", "port": parts.port, "protocol": "TCP"}],
                    "endpoints": [{"addresses": [parts.hostname], "conditions": {"ready": ready}}],
                }
            )

    def set_ready(self, namespace: str, port: int, ready: bool) -> None:
        for item in self.slices[namespace]:
            if item["ports"][0]["port"] == port:
                item["endpoints"][0]["conditions"]["ready"] = ready


def _matches(selector: str, labels: dict[str, str]) -> bool:
    wanted = dict(term.split("=", 1) for term in selector.split(",") if term)
    return all(labels.get(key) == value for key, value in wanted.items())


@asynccontextmanager
async def api_server(cluster: FakeCluster) -> AsyncIterator[str]:
    async def endpoint_slices(request: web.Request) -> web.Response:
        cluster.requests.append(str(request.rel_url))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"kind": "Status", "message": "Unauthorized"}, status=401)
        selector = request.query.get("labelSelector", "")
        items = [
            item
            for item in cluster.slices.get(request.match_info["namespace"], [])
            if _matches(selector, item["metadata"]["labels"])
        ]
        return web.json_response(
            {"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1", "items": items}
        )

    async def service(request: web.Request) -> web.Response:
        cluster.requests.append(str(request.rel_url))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"kind": "Status", "message": "Unauthorized"}, status=401)
        found = cluster.services.get((request.match_info["namespace"], request.match_info["name"]))
        if found is None:
            return web.json_response({"kind": "Status", "message": "not found"}, status=404)
        return web.json_response(found)

    app = web.Application()
    app.router.add_get("/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices", endpoint_slices)
    app.router.add_get("/api/v1/namespaces/{namespace}/services/{name}", service)
    async with serving_app(app) as url:
        yield url
