"""Actuators: what turns a ``Recommendation`` into a fleet of that size.

Three behind one protocol. ``LogActuator`` only prints (a dry run, and the default). ``SimActuator``
resizes a simulated fleet through the simulator's control API (``POST /replicas`` adds one that
cold-starts, ``DELETE /replicas/{id}`` drains then removes one), newest replicas first, so the
closed loop exercises real cold starts; given the gateways' URLs it also sets the pool's replica set
on each (``PUT /admin/pools/{pool}/replicas``), ordered so no request is sent to a replica that is
gone: on the way out the replica exists before the gateway learns of it (and stays cold there until
its health check passes), on the way in the gateway forgets it before it drains.
``KubernetesActuator`` patches a Deployment's scale subresource with the official client; the
client is synchronous, so calls run in a worker thread. Given the core API and the gateways, a
scale-in cuts no stream: it chooses the pods to remove (``choose_victims``: least work in flight
summed over every gateway's ``/admin/pools``, a pod no gateway routes to first, then the newest),
takes them out of routing (label ``kvgate.io/routable=false``, which the fleet's Service selects on
and its Deployment does not, so the pods leave the EndpointSlices every gateway follows but stay
the Deployment's), waits until no gateway lists them and each reports nothing running or waiting on
its own ``/metrics`` (at most ``drain_timeout_s``), marks them first to go
(``controller.kubernetes.io/pod-deletion-cost``) and only then patches the scale. A pod left out of
routing by a scale-in that did not happen (the desired size went back up) is put back.
Each actuator is idempotent: applying the same recommendation twice changes nothing the second time.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TextIO, cast

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


class AppsApi(ScaleApi, Protocol):
    def read_namespaced_deployment(self, name: str, namespace: str) -> Any: ...


class PodApi(Protocol):
    """The part of ``kubernetes.client.CoreV1Api`` the drain uses."""

    def list_namespaced_pod(self, namespace: str, *, label_selector: str | None = ...) -> Any: ...

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any) -> Any: ...


ROUTABLE_LABEL = "kvgate.io/routable"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
FIRST_TO_GO = "-1000"
"""The deletion cost of a drained pod: below every other pod's (0 unless set), so the ReplicaSet
removes the drained pods and no other when the scale goes down."""
_RUNNING = re.compile(r"^vllm:num_requests_(?:running|waiting)(?:\{[^}]*\})?\s+(\S+)", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class PodReplica:
    """A running pod of the Deployment, as the drain sees it."""

    name: str
    address: str
    """``ip:port``: how the gateways' replica URLs name it (the pod IP, the container's first port)."""
    created: str
    """Creation time (RFC 3339, so text order is time order)."""
    routable: bool | None
    """The ``kvgate.io/routable`` label: None when the pod does not carry it (no drain by label)."""


def choose_victims(pods: Sequence[PodReplica], in_flight: Mapping[str, int], count: int) -> list[PodReplica]:
    """The ``count`` pods to remove: least work in flight (summed over the gateways, by address),
    then those no gateway routes to (already out, or not ready), then the newest."""
    listed = set(in_flight)

    def order(pod: PodReplica) -> tuple[int, bool, str]:
        return (in_flight.get(pod.address, 0), pod.address in listed, _negated(pod.created))

    return sorted(pods, key=order)[: max(0, count)]


def _negated(text: str) -> str:
    """A key that sorts ``text`` in reverse (newest first for RFC 3339 times)."""
    return "".join(chr(0x10FFFF - ord(ch)) for ch in text)


class KubernetesActuator:
    """Sets ``spec.replicas`` of one Deployment per pool through the scale subresource; with
    ``pods`` and ``gateways``, drains the pods a scale-in removes first (see the module)."""

    def __init__(
        self,
        api: ScaleApi,
        namespace: str,
        deployments: Mapping[str, str],
        pods: PodApi | None = None,
        session: Any = None,
        gateways: Callable[[], Awaitable[Sequence[str]]] | None = None,
        admin_token: str | None = None,
        drain_timeout_s: float = 600.0,
        poll_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self._api = api
        self._namespace = namespace
        self._deployments = dict(deployments)
        self._pods = pods
        self._session = session
        self._gateways = gateways
        self._admin_headers = {} if admin_token is None else {"Authorization": f"Bearer {admin_token}"}
        self._drain_timeout_s = drain_timeout_s
        self._poll_s = poll_s
        self._clock = clock
        self._log = log or (lambda line: print(line, file=sys.stderr, flush=True))

    async def apply(self, recommendation: Recommendation) -> None:
        name = self._deployments.get(recommendation.pool)
        if name is None:
            return
        scale = await asyncio.to_thread(self._api.read_namespaced_deployment_scale, name, self._namespace)
        current, desired = scale.spec.replicas, recommendation.desired_replicas
        drains = self._pods is not None and self._session is not None and self._gateways is not None
        try:
            if drains and desired < current:
                await self._drain(recommendation.pool, name, current - desired)
            elif drains:
                await self._route_all(name)
        except Exception as exc:  # the API's or a gateway's refusal: scale as before, each pod's own drain
            self._log(f"pool={recommendation.pool} drain before scaling {name} skipped: {exc}")
        if current == desired:
            return
        body = {"spec": {"replicas": desired}}
        await asyncio.to_thread(self._api.patch_namespaced_deployment_scale, name, self._namespace, body)

    async def _live_pods(self, deployment: str) -> list[PodReplica]:
        assert self._pods is not None
        apps = cast(AppsApi, self._api)
        spec = (await asyncio.to_thread(apps.read_namespaced_deployment, deployment, self._namespace)).spec
        selector = ",".join(f"{k}={v}" for k, v in sorted((spec.selector.match_labels or {}).items()))
        listed = await asyncio.to_thread(
            self._pods.list_namespaced_pod, self._namespace, label_selector=selector
        )
        pods = []
        for pod in listed.items:
            meta, status = pod.metadata, pod.status
            if meta.deletion_timestamp is not None or status is None or not status.pod_ip:
                continue
            ports = [p.container_port for c in pod.spec.containers for p in (c.ports or [])]
            if not ports:
                continue
            host = f"[{status.pod_ip}]" if ":" in status.pod_ip else status.pod_ip
            label = (meta.labels or {}).get(ROUTABLE_LABEL)
            created = meta.creation_timestamp
            stamp = created.isoformat() if hasattr(created, "isoformat") else str(created or "")
            pods.append(
                PodReplica(meta.name, f"{host}:{ports[0]}", stamp, None if label is None else label == "true")
            )
        return pods

    async def _in_flight(self, pool: str) -> dict[str, int]:
        """Requests in flight per replica address, summed over every gateway that routes to it."""
        assert self._gateways is not None
        counts: dict[str, int] = {}
        for gateway in await self._gateways():
            url = f"{gateway.rstrip('/')}/admin/pools/{pool}"
            async with self._session.get(url, headers=self._admin_headers) as response:
                response.raise_for_status()
                doc = await response.json()
            for replica in doc.get("replicas", []):
                address = str(replica["url"]).split("://", 1)[-1]
                counts[address] = counts.get(address, 0) + int(replica.get("in_flight", 0))
        return counts

    async def _label(self, pod: PodReplica, routable: bool) -> None:
        assert self._pods is not None
        body = {"metadata": {"labels": {ROUTABLE_LABEL: "true" if routable else "false"}}}
        await asyncio.to_thread(self._pods.patch_namespaced_pod, pod.name, self._namespace, body)

    async def _route_all(self, deployment: str) -> None:
        for pod in await self._live_pods(deployment):
            if pod.routable is False:
                await self._label(pod, True)

    async def _drain(self, pool: str, deployment: str, count: int) -> None:
        pods = await self._live_pods(deployment)
        victims = choose_victims(pods, await self._in_flight(pool), count)
        chosen = {v.name for v in victims}
        for pod in pods:
            if pod.name not in chosen and pod.routable is False:
                await self._label(pod, True)
        for pod in victims:
            if pod.routable:
                await self._label(pod, False)
        self._log(
            f"pool={pool} draining {[v.name for v in victims]} before scaling {deployment} in by {count}"
        )
        deadline = self._clock() + self._drain_timeout_s
        labelled = [v for v in victims if v.routable is not None]
        while labelled and not await self._drained(pool, labelled):
            if self._clock() >= deadline:
                self._log(f"pool={pool} drain timed out after {self._drain_timeout_s:g} s; removing anyway")
                break
            await asyncio.sleep(self._poll_s)
        assert self._pods is not None
        for pod in victims:
            body = {"metadata": {"annotations": {DELETION_COST: FIRST_TO_GO}}}
            await asyncio.to_thread(self._pods.patch_namespaced_pod, pod.name, self._namespace, body)

    async def _drained(self, pool: str, victims: Sequence[PodReplica]) -> bool:
        """No gateway routes to any victim, and each says nothing is running or waiting on it."""
        routed = await self._in_flight(pool)
        if any(v.address in routed for v in victims):
            return False
        for victim in victims:
            try:
                async with self._session.get(f"http://{victim.address}/metrics") as response:
                    text = await response.text()
            except OSError:
                continue  # gone: nothing runs on it
            if sum(float(v) for v in _RUNNING.findall(text)) > 0:
                return False
        return True


def kubernetes_apps_api() -> ScaleApi:
    """An ``AppsV1Api`` configured from the pod's service account, or else from ``~/.kube/config``.
    The client library is the ``k8s`` extra; without it, one clear error."""
    return kubernetes_apis()[0]


def kubernetes_apis() -> tuple[AppsApi, PodApi]:
    """``AppsV1Api`` and ``CoreV1Api`` on one configuration (see ``kubernetes_apps_api``)."""
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
    apps: AppsApi = client.AppsV1Api()
    core: PodApi = client.CoreV1Api()
    return apps, core
