"""DNS discovery: a pool whose replicas are the addresses behind one name (a headless Service).

The name is re-resolved every ``refresh_s``; the pool's replica set becomes exactly the addresses
returned, through ``GatewayState.set_pool_urls``: an address that appears starts cold (not routable
until its health check passes, as a pod that just became Ready may still be warming up) and one that
vanishes takes no new requests while those it is serving finish. A failed lookup keeps the previous
set: a DNS hiccup must not empty a fleet. In a pod, a name that is a ClusterIP Service's is refused
at the first refresh (``kvgate.gateway.replicas.kubernetes.clusterip_refusal``): the pool keeps no
replica and the error says why.

``discoveries_for`` gives each discovered pool its discovery: DNS, or the Kubernetes API's
EndpointSlices (``kvgate.gateway.replicas.kubernetes``).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Sequence
from typing import Protocol

import aiohttp

from kvgate.config.pools import DnsReplicas, Pool
from kvgate.gateway.replicas.kubernetes import (
    KubernetesApi,
    KubernetesDiscovery,
    clusterip_refusal,
    replace_pool_urls,
)
from kvgate.gateway.state import GatewayState

logger = logging.getLogger("kvgate.discovery")


class Discovery(Protocol):
    async def refresh(self) -> None: ...

    async def run(self) -> None: ...


def discoveries_for(
    state: GatewayState, pools: Sequence[Pool], session: aiohttp.ClientSession
) -> list[Discovery]:
    found: list[Discovery] = []
    for pool in pools:
        if pool.dns is not None:
            found.append(DnsDiscovery(state, pool.name, pool.dns, session, KubernetesApi.in_cluster()))
        elif pool.kubernetes is not None:
            found.append(KubernetesDiscovery(state, pool.name, pool.kubernetes, session))
    return found


class DnsDiscovery:
    def __init__(
        self,
        state: GatewayState,
        pool_name: str,
        dns: DnsReplicas,
        session: aiohttp.ClientSession | None = None,
        api: KubernetesApi | None = None,
    ) -> None:
        self._state = state
        self._pool_name = pool_name
        self._dns = dns
        self._session = session
        self._api = api
        self._checked = session is None or api is None
        self.refused: str | None = None
        """Why the name is not used (a ClusterIP Service's), once the check found it."""

    async def resolve(self) -> list[str] | None:
        """The replica URLs behind the name, or None when it cannot be resolved now."""
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(self._dns.name, self._dns.port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            logger.warning(
                "pool %s: cannot resolve %s (%s); keeping its replicas", self._pool_name, self._dns.name, exc
            )
            return None
        urls = set()
        for family, _, _, _, sockaddr in infos:
            host = str(sockaddr[0])
            host = f"[{host}]" if family == socket.AF_INET6 else host
            urls.add(f"{self._dns.scheme}://{host}:{self._dns.port}")
        return sorted(urls)

    async def refresh(self) -> None:
        if not self._checked and self._session is not None:
            self._checked = True
            self.refused = await clusterip_refusal(self._dns, self._session, self._api)
        if self.refused is not None:
            logger.error("pool %s: refused: %s", self._pool_name, self.refused)
            self._state.set_pool_urls(self._pool_name, [])
            return
        urls = await self.resolve()
        if urls is not None:
            replace_pool_urls(self._state, self._pool_name, urls, f"the addresses of {self._dns.name}")

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._dns.refresh_s)
            await self.refresh()
