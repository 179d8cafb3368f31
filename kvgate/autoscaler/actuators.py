"""Actuators: what turns a ``Recommendation`` into a fleet of that size.

Three behind one protocol. ``LogActuator`` only prints (a dry run, and the default). ``SimActuator``
resizes a simulated fleet through the simulator's control API (``POST /replicas`` adds one that
cold-starts, ``DELETE /replicas/{id}`` drains then removes one), newest replicas first, so the
closed loop exercises real cold starts; given the gateways' URLs it also sets the pool's replica set
on each (``PUT /admin/pools/{pool}/replicas``), ordered so no request is sent to a replica that is
gone: on the way out the replica exists before the gateway learns of it (and stays cold there until
its health check passes), on the way in the gateway forgets it before it drains.
``KubernetesActuator`` patches a Deployment's scale subresource with the official client; the
client is synchronous, so calls run in a worker thread.
Each actuator is idempotent: applying the same recommendation twice changes nothing the second time.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TextIO

import aiohttp

from kvgate.autoscaler.recommendation import Recommendation

LIVE_SIM_STATES = frozenset({"starting", "ready", "paused"})


class Actuator(Protocol):
    async def apply(self, recommendation: Recommendation) -> None: ...


class LogActuator:
    def __init__(self, out: TextIO = sys.stdout) -> None:
        self._out = out

    async def apply(self, recommendation: Recommendation) -> None:
        r = recommendation
        print(
            f"pool={r.pool} desired={r.desired_replicas} reason={r.reason} {r.detail}",
            file=self._out,
            flush=True,
        )


class SimActuator:
    """One simulated fleet per pool, each reached at its control URL; optionally the gateways in front
    (``gateway_url`` for one, ``gateway_urls`` for several)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        control_urls: Mapping[str, str],
        cold_start_s: float | None = None,
        gateway_url: str | None = None,
        admin_token: str | None = None,
        gateway_urls: Sequence[str] = (),
    ) -> None:
        self._session = session
        self._control_urls = {pool: url.rstrip("/") for pool, url in control_urls.items()}
        self._cold_start_s = cold_start_s
        urls = [gateway_url] if gateway_url is not None else []
        self._gateway_urls = [url.rstrip("/") for url in [*urls, *gateway_urls]]
        self._admin_headers = {} if admin_token is None else {"Authorization": f"Bearer {admin_token}"}

    async def live(self, pool: str) -> list[dict[str, Any]]:
        async with self._session.get(f"{self._control_urls[pool]}/replicas") as response:
            response.raise_for_status()
            body = await response.json()
        return [r for r in body["replicas"] if r["state"] in LIVE_SIM_STATES]

    async def apply(self, recommendation: Recommendation) -> None:
        pool = recommendation.pool
        base = self._control_urls.get(pool)
        if base is None:
            return
        live = await self.live(pool)
        missing = recommendation.desired_replicas - len(live)
        if missing > 0:
            body = {} if self._cold_start_s is None else {"cold_start_s": self._cold_start_s}
            for _ in range(missing):
                async with self._session.post(f"{base}/replicas", json=body) as response:
                    response.raise_for_status()
                    live.append(await response.json())
            await self.tell_gateway(pool, [r["url"] for r in live])
        elif missing < 0:
            newest_first = sorted(live, key=lambda r: (r["state"] != "starting", -int(r["id"])))
            victims = newest_first[:-missing]
            victim_ids = {r["id"] for r in victims}
            await self.tell_gateway(pool, [r["url"] for r in live if r["id"] not in victim_ids])
            await asyncio.gather(*(self._remove(base, r["id"]) for r in victims))
        else:
            await self.tell_gateway(pool, [r["url"] for r in live])

    async def tell_gateway(self, pool: str, urls: list[str]) -> None:
        """Make ``urls`` every gateway's replica set for ``pool`` (idempotent; nothing without gateways)."""
        await asyncio.gather(*(self._tell(gateway, pool, urls) for gateway in self._gateway_urls))

    async def _tell(self, gateway: str, pool: str, urls: list[str]) -> None:
        url = f"{gateway}/admin/pools/{pool}/replicas"
        async with self._session.put(url, json={"urls": urls}, headers=self._admin_headers) as response:
            response.raise_for_status()

    async def _remove(self, base: str, replica_id: int) -> None:
        async with self._session.delete(f"{base}/replicas/{replica_id}") as response:
            response.raise_for_status()


class ScaleApi(Protocol):
    """The part of ``kubernetes.client.AppsV1Api`` this actuator uses."""

    def read_namespaced_deployment_scale(self, name: str, namespace: str) -> Any: ...

    def patch_namespaced_deployment_scale(self, name: str, namespace: str, body: Any) -> Any: ...


class KubernetesActuator:
    """Sets ``spec.replicas`` of one Deployment per pool through the scale subresource."""

    def __init__(self, api: ScaleApi, namespace: str, deployments: Mapping[str, str]) -> None:
        self._api = api
        self._namespace = namespace
        self._deployments = dict(deployments)

    async def apply(self, recommendation: Recommendation) -> None:
        name = self._deployments.get(recommendation.pool)
        if name is None:
            return
        scale = await asyncio.to_thread(self._api.read_namespaced_deployment_scale, name, self._namespace)
        if scale.spec.replicas == recommendation.desired_replicas:
            return
        body = {"spec": {"replicas": recommendation.desired_replicas}}
        await asyncio.to_thread(self._api.patch_namespaced_deployment_scale, name, self._namespace, body)


def kubernetes_apps_api() -> ScaleApi:
    """An ``AppsV1Api`` configured from the pod's service account, or else from ``~/.kube/config``.
    The client library is the ``k8s`` extra; without it, one clear error."""
    try:
        from kubernetes import client
        from kubernetes import config as kube_config
    except ImportError:
        raise ValueError("the kubernetes actuator needs the k8s extra: pip install 'kvgate[k8s]'") from None

    loader: Any = kube_config
    try:
        loader.load_incluster_config()
    except loader.ConfigException:
        try:
            loader.load_kube_config()
        except (loader.ConfigException, OSError) as exc:
            raise ValueError(f"no Kubernetes credentials (in-cluster or kubeconfig): {exc}") from exc
    api: ScaleApi = client.AppsV1Api()
    return api
