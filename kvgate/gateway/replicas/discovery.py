"""DNS discovery: a pool whose replicas are the addresses behind one name (a headless Service).

The name is re-resolved every ``refresh_s``; the pool's replica set becomes exactly the addresses
returned, through ``GatewayState.set_pool_urls``: an address that appears starts cold (not routable
until its health check passes, as a pod that just became Ready may still be warming up) and one that
vanishes takes no new requests while those it is serving finish. A failed lookup keeps the previous
set: a DNS hiccup must not empty a fleet.
"""

from __future__ import annotations

import asyncio
import logging
import socket

from kvgate.config.pools import DnsReplicas
from kvgate.gateway.state import GatewayState

logger = logging.getLogger("kvgate.discovery")


class DnsDiscovery:
    def __init__(self, state: GatewayState, pool_name: str, dns: DnsReplicas) -> None:
        self._state = state
        self._pool_name = pool_name
        self._dns = dns

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
        urls = await self.resolve()
        if urls is None:
            return
        before = {r.url for r in self._state.replicas.values() if r.pool == self._pool_name}
        self._state.set_pool_urls(self._pool_name, urls)
        added, gone = sorted(set(urls) - before), sorted(before - set(urls))
        if added or gone:
            logger.info(
                "pool %s: %s now resolves to %s (new: %s; gone: %s)",
                self._pool_name,
                self._dns.name,
                urls,
                added,
                gone,
            )

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._dns.refresh_s)
            await self.refresh()
