"""Active health checks: each replica's health path, probed on an interval, feeding readiness.

A replica starts unprobed and not routable. ``healthy_threshold`` consecutive answers of 200 make
it routable; ``unhealthy_threshold`` consecutive failures (any other status, a timeout, a refused
connection) take it out. ``/readyz`` is true while at least one replica is routable.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from config.schema import Health
from gateway.state import GatewayState, ReplicaState


class HealthMonitor:
    def __init__(self, state: GatewayState, session: aiohttp.ClientSession, health: Health) -> None:
        self._state = state
        self._session = session
        self._health = health
        self._timeout = aiohttp.ClientTimeout(total=health.timeout_s)

    async def probe_all(self) -> None:
        replicas = list(self._state.replicas.values())
        results = await asyncio.gather(*(self._probe(r) for r in replicas))
        for replica, ok in zip(replicas, results, strict=True):
            self.record(replica, ok)

    def record(self, replica: ReplicaState, ok: bool) -> None:
        if ok:
            replica.probe_failures = 0
            replica.probe_successes += 1
            if replica.probe_successes >= self._health.healthy_threshold:
                replica.healthy = True
        else:
            replica.probe_successes = 0
            replica.probe_failures += 1
            if replica.probe_failures >= self._health.unhealthy_threshold:
                replica.healthy = False

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._health.interval_s)
            await self.probe_all()

    async def _probe(self, replica: ReplicaState) -> bool:
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            async with self._session.get(replica.url + self._health.path, timeout=self._timeout) as response:
                await response.read()
                return response.status == 200
        return False
