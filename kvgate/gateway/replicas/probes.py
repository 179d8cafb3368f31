"""Active health checks: each replica's health path, probed on an interval.

Each probe's outcome (200 is a success; any other status, a timeout or a refused connection is a
failure) goes to the fleet's ``HealthTracker`` (``kvgate.gateway.replicas.fleet``), the same state machine
that passive observations of real requests feed, so one set of thresholds (the ``health`` section) decides
when a replica is routable, ejected and back. ``/readyz`` is true while at least one replica is routable. A
probe carries the pool's ``api_key`` (vLLM's ``--api-key`` guards only ``/v1/*``, but a proxy in front of a
replica may guard everything).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

import aiohttp

from kvgate.config.health import Health
from kvgate.gateway.replicas.upstream import replica_headers
from kvgate.gateway.state import GatewayState, ReplicaState
from kvgate.routing.health import Outcome


class HealthSink(Protocol):
    def observe_outcome(
        self, replica: ReplicaState, outcome: Outcome, retry_after_s: float | None = None
    ) -> None: ...


class HealthMonitor:
    def __init__(
        self, state: GatewayState, session: aiohttp.ClientSession, health: Health, sink: HealthSink
    ) -> None:
        self._state = state
        self._session = session
        self._health = health
        self._sink = sink
        self._timeout = aiohttp.ClientTimeout(total=health.timeout_s)

    async def probe_all(self) -> None:
        replicas = list(self._state.replicas.values())
        results = await asyncio.gather(*(self._probe(r) for r in replicas))
        for replica, ok in zip(replicas, results, strict=True):
            if ok:
                replica.probe_successes += 1
            else:
                replica.probe_failures += 1
            self._sink.observe_outcome(replica, Outcome.SUCCESS if ok else Outcome.FAILURE)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._health.interval_s)
            await self.probe_all()

    async def _probe(self, replica: ReplicaState) -> bool:
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            async with self._session.get(
                replica.url + self._health.path, headers=replica_headers(replica), timeout=self._timeout
            ) as response:
                await response.read()
                return response.status == 200
        return False
