"""Discovery through the Kubernetes API: a pool's replicas are the ready endpoints of EndpointSlices.

An existing vLLM fleet is found by a label selector on its EndpointSlices (which carry their
Service's labels) or by its Service's name (``kubernetes.io/service-name``), read every
``refresh_s`` with a GET (``/apis/discovery.k8s.io/v1/namespaces/<ns>/endpointslices``). Each
endpoint whose ``conditions.ready`` is not false and that has the configured port (by name or
number) is one replica, ``<scheme>://<address>:<port>``: a pod being deleted turns not ready at
once, so it leaves the pool (no new request; those in flight finish) before its process stops.
The pool's set goes through ``GatewayState.set_pool_urls`` as DNS discovery's does, and a failed
read keeps the previous set.

A ClusterIP Service's DNS name resolves to one virtual IP, which a DNS pool would count as one
replica while the Service spreads its requests over every pod behind it: routing, capacity and
prefix-cache affinity would all be wrong. So in a pod (the API server's address in the
environment), a DNS pool whose name is a Service's (``<service>.<namespace>.svc...``) is checked
once through the API, and a ClusterIP Service is refused: the pool gets no replica, and the error
says why and what to use instead (a headless Service, or ``kubernetes`` discovery).

The API server is the pod's own cluster unless ``api_url`` says otherwise: its address from
``KUBERNETES_SERVICE_HOST``/``KUBERNETES_SERVICE_PORT``, the service account's token (read at every
call, as it rotates) and its CA. The Role this needs is get and list on ``endpointslices`` (and
get on ``services`` for the check), in the fleet's namespace.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from kvgate.config.pools import SERVICE_ACCOUNT, DnsReplicas, KubernetesReplicas
from kvgate.gateway.state import GatewayState

logger = logging.getLogger("kvgate.discovery")

ENDPOINT_SLICES = "/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
SERVICE = "/api/v1/namespaces/{namespace}/services/{name}"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
_SERVICE_DNS = re.compile(
    r"^(?P<service>[a-z0-9]([-a-z0-9]*[a-z0-9])?)\.(?P<namespace>[a-z0-9][-a-z0-9]*)\.svc(\.|$)"
)
_TIMEOUT = aiohttp.ClientTimeout(total=5)


class KubernetesError(Exception):
    """The API server could not be asked, or answered something else than the object."""


@dataclass(frozen=True, slots=True)
class KubernetesApi:
    base_url: str
    token_file: str
    ca_file: str

    @classmethod
    def in_cluster(cls, environ: Mapping[str, str] | None = None) -> KubernetesApi | None:
        """The pod's own API server, or None outside a pod."""
        environ = os.environ if environ is None else environ
        host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            return None
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{port}", f"{SERVICE_ACCOUNT}/token", f"{SERVICE_ACCOUNT}/ca.crt")

    @classmethod
    def for_pool(cls, config: KubernetesReplicas, environ: Mapping[str, str] | None = None) -> KubernetesApi:
        if config.api_url is not None:
            return cls(config.api_url.rstrip("/"), config.token_file, config.ca_file)
        api = cls.in_cluster(environ)
        if api is None:
            raise KubernetesError(
                "no api_url and not in a pod (KUBERNETES_SERVICE_HOST is unset): give kubernetes.api_url"
            )
        return cls(api.base_url, config.token_file, config.ca_file)

    async def get(
        self, session: aiohttp.ClientSession, path: str, params: Mapping[str, str] | None = None
    ) -> Any:
        headers = {"Accept": "application/json"}
        token = _read(self.token_file)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        context: ssl.SSLContext | bool = True
        if self.base_url.startswith("https://") and Path(self.ca_file).is_file():
            context = ssl.create_default_context(cafile=self.ca_file)
        try:
            async with session.get(
                self.base_url + path, params=params, headers=headers, timeout=_TIMEOUT, ssl=context
            ) as response:
                body = await response.json(content_type=None)
                if response.status != 200:
                    message = body.get("message") if isinstance(body, dict) else None
                    raise KubernetesError(f"GET {path}: {response.status} {message or response.reason}")
                return body
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            raise KubernetesError(f"GET {path}: {exc or type(exc).__name__}") from None


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def own_namespace() -> str:
    return _read(f"{SERVICE_ACCOUNT}/namespace") or "default"


def ready_urls(slices: Any, port: str, scheme: str) -> list[str]:
    """The replica URLs of an EndpointSliceList: each ready endpoint's addresses with ``port``."""
    urls: set[str] = set()
    items = slices.get("items") if isinstance(slices, Mapping) else None
    for item in items if isinstance(items, list) else []:
        number = _port_of(item.get("ports") or [], port)
        if number is None or item.get("addressType") not in ("IPv4", "IPv6", "FQDN"):
            continue
        for endpoint in item.get("endpoints") or []:
            if (endpoint.get("conditions") or {}).get("ready") is False:
                continue
            for address in endpoint.get("addresses") or []:
                host = f"[{address}]" if ":" in address else address
                urls.add(f"{scheme}://{host}:{number}")
    return sorted(urls)


def _port_of(ports: list[Any], wanted: str) -> int | None:
    for entry in ports:
        number = entry.get("port")
        if isinstance(number, int) and (entry.get("name") == wanted or str(number) == wanted):
            return number
    return None


class KubernetesDiscovery:
    """A pool whose replicas are the ready endpoints of EndpointSlices (see the module)."""

    def __init__(
        self,
        state: GatewayState,
        pool_name: str,
        config: KubernetesReplicas,
        session: aiohttp.ClientSession,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._state = state
        self._pool_name = pool_name
        self._config = config
        self._session = session
        self._environ = environ
        self._namespace = config.namespace or own_namespace()
        selector = config.selector or f"{SERVICE_NAME_LABEL}={config.service}"
        self._params = {"labelSelector": selector}
        self._what = f"EndpointSlices of {selector!r} in namespace {self._namespace}"

    async def resolve(self) -> list[str] | None:
        try:
            api = KubernetesApi.for_pool(self._config, self._environ)
            path = ENDPOINT_SLICES.format(namespace=self._namespace)
            slices = await api.get(self._session, path, self._params)
        except KubernetesError as exc:
            logger.warning(
                "pool %s: cannot read the %s (%s); keeping its replicas", self._pool_name, self._what, exc
            )
            return None
        return ready_urls(slices, self._config.port, self._config.scheme)

    async def refresh(self) -> None:
        urls = await self.resolve()
        if urls is not None:
            replace_pool_urls(self._state, self._pool_name, urls, f"the {self._what}")

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._config.refresh_s)
            await self.refresh()


def replace_pool_urls(state: GatewayState, pool_name: str, urls: list[str], source: str) -> None:
    """Make ``urls`` the pool's replicas and log what changed, naming where they came from."""
    before = {r.url for r in state.replicas.values() if r.pool == pool_name}
    state.set_pool_urls(pool_name, urls)
    added, gone = sorted(set(urls) - before), sorted(before - set(urls))
    if added or gone:
        logger.info("pool %s: %s now list %s (new: %s; gone: %s)", pool_name, source, urls, added, gone)


async def clusterip_refusal(
    dns: DnsReplicas, session: aiohttp.ClientSession, api: KubernetesApi | None
) -> str | None:
    """Why a DNS pool's name must not be used: it names a ClusterIP Service (see the module). None
    when it does not, or when it cannot be told (not a Service's name, no API, no answer)."""
    match = _SERVICE_DNS.match(dns.name.lower())
    if match is None or api is None:
        return None
    service, namespace = match["service"], match["namespace"]
    try:
        body = await api.get(session, SERVICE.format(namespace=namespace, name=service))
    except KubernetesError as exc:
        logger.info("cannot read Service %s/%s to check it is headless (%s)", namespace, service, exc)
        return None
    spec = body.get("spec") if isinstance(body, Mapping) else None
    cluster_ip = spec.get("clusterIP") if isinstance(spec, Mapping) else None
    if not cluster_ip or cluster_ip == "None":
        return None
    return (
        f"{dns.name} is ClusterIP Service {namespace}/{service} (clusterIP {cluster_ip}): its name "
        "resolves to one virtual IP that the Service spreads over every pod, which kvgate would count "
        "as one replica, so its capacity, load and prefix caches would all be wrong. Give the pool a "
        "headless Service (clusterIP: None) selecting the same pods, or kubernetes: {service: "
        f"{service}, namespace: {namespace}}} to read its EndpointSlices"
    )
