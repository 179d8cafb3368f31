"""DNS discovery: a pool whose replicas are the addresses behind one name (a headless Service).

The name is re-resolved every ``refresh_s``; the pool's replica set becomes exactly the addresses
returned. A failed lookup keeps the previous set: a DNS hiccup must not empty a fleet.
"""

from __future__ import annotations

import asyncio
import socket

from config.schema import DnsReplicas
from gateway.state import GatewayState


class DnsDiscovery:
    def __init__(self, state: GatewayState, pool_name: str, dns: DnsReplicas) -> None:
        self._state = state
        self._pool_name = pool_name
        self._dns = dns

    async def resolve(self) -> list[str] | None:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(self._dns.name, self._dns.port, type=socket.SOCK_STREAM)
        except OSError:
            return None
        urls = set()
        for family, _, _, _, sockaddr in infos:
            host = str(sockaddr[0])
            host = f"[{host}]" if family == socket.AF_INET6 else host
            urls.add(f"{self._dns.scheme}://{host}:{self._dns.port}")
        return sorted(urls)

    async def refresh(self) -> None:
        urls = await self.resolve()
        if urls is not None:
            self._state.set_pool_urls(self._pool_name, urls)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._dns.refresh_s)
            await self.refresh()
