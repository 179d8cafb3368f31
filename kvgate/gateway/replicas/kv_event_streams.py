"""Each replica's KV cache events, subscribed to and handed to the router's cache index.

A replica started with ``--kv-events-config`` publishes its cache's changes over ZMQ PUB
(``kvgate.routing.kv_events``); ``GET /kv_event_sources`` says where (vLLM's own route). Every
``interval_s`` the gateway looks for replicas it does not follow yet (in pools with ``kv_events:
auto``), asks each once where it publishes, and subscribes; a replica that publishes nothing, or
whose endpoint cannot be reached from here (bound to a local socket), is asked again only after it
leaves and comes back, and routing reads what kvgate routed there instead. An endpoint bound on
every interface (``tcp://*:5557``) is reached at the replica's own host.

The messages carry a sequence number that starts at 0 when the replica starts and grows by one per
message: one that does not follow the last (a message dropped, the replica restarted) means the
index no longer knows what the cache holds, so the replica's entry starts over, empty, and fills
again from its next events (an under-statement, never a false hit). A replica that leaves the fleet
is unsubscribed and forgotten. Decoding and applying an event is cheap next to the step that
produced it; everything runs on the event loop, nothing blocks it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
import zmq
import zmq.asyncio

from kvgate.config.pools import Pool
from kvgate.gateway.replicas.upstream import replica_headers
from kvgate.gateway.state import GatewayState, ReplicaState
from kvgate.gateway.telemetry.metrics import GatewayMetrics
from kvgate.routing.cache_index import CacheIndex
from kvgate.routing.kv_events import KvEventError, decode_batch, sequence_number

log = logging.getLogger("kvgate.kv_events")

SOURCES_PATH = "/kv_event_sources"


@dataclass(frozen=True, slots=True)
class EventSource:
    endpoint: str
    topic: str


def event_source(answer: object, replica_url: str) -> EventSource | None:
    """Where a replica publishes, from its ``/kv_event_sources`` answer (one entry per data-parallel
    rank; the first ZMQ one is taken), its ``*`` host made the replica's own; None when it publishes
    nothing a remote subscriber can reach."""
    if not isinstance(answer, dict):
        return None
    for config in answer.values():
        if not isinstance(config, dict) or not config.get("enable_kv_cache_events"):
            continue
        if config.get("publisher", "zmq") != "zmq":
            continue
        endpoint = config.get("endpoint")
        if not isinstance(endpoint, str) or not endpoint.startswith("tcp://"):
            continue
        host = urlsplit(replica_url).hostname or ""
        address = endpoint.removeprefix("tcp://")
        bound_host, _, port = address.rpartition(":")
        if not port.isdigit():
            continue
        if bound_host in ("*", "0.0.0.0", "[::]", "::"):
            bound_host = f"[{host}]" if ":" in host else host
        topic = config.get("topic")
        return EventSource(f"tcp://{bound_host}:{port}", topic if isinstance(topic, str) else "")
    return None


class KvEventStreams:
    """The subscriptions: one task and one SUB socket per replica that publishes."""

    def __init__(
        self,
        state: GatewayState,
        cache: CacheIndex,
        pools: Iterable[Pool],
        session: aiohttp.ClientSession,
        metrics: GatewayMetrics,
        interval_s: float,
    ) -> None:
        self._state = state
        self._cache = cache
        self._pools = {pool.name for pool in pools if pool.kv_events == "auto"}
        self._session = session
        self._metrics = metrics
        self._interval_s = interval_s
        self._context: zmq.asyncio.Context | None = None
        """Made with the first subscription, so a gateway following nothing holds no ZMQ threads."""
        self._followed: dict[str, asyncio.Task[None]] = {}
        self._asked: set[str] = set()
        """Replicas asked where they publish (whatever the answer), until they leave."""
        self._timeout = aiohttp.ClientTimeout(total=max(1.0, min(5.0, interval_s)))

    @property
    def enabled(self) -> bool:
        return bool(self._pools)

    def following(self) -> frozenset[str]:
        return frozenset(self._followed)

    async def run(self) -> None:
        try:
            while True:
                await self.reconcile()
                await asyncio.sleep(self._interval_s)
        finally:
            await self.close()

    async def reconcile(self) -> None:
        """Subscribe to replicas not asked yet; drop the ones that left."""
        replicas = self._state.replicas
        for replica_id in [r for r in self._followed if r not in replicas]:
            await self._stop(replica_id)
        self._asked &= set(replicas)
        new = [r for r in replicas.values() if r.pool in self._pools and r.replica_id not in self._asked]
        for replica, source in zip(new, await asyncio.gather(*(self._ask(r) for r in new)), strict=True):
            self._asked.add(replica.replica_id)
            if source is not None and replica.replica_id in self._state.replicas:
                self._follow(replica, source)

    async def _ask(self, replica: ReplicaState) -> EventSource | None:
        try:
            async with self._session.get(
                replica.url + SOURCES_PATH, headers=replica_headers(replica), timeout=self._timeout
            ) as response:
                if response.status != 200:
                    return None
                answer = await response.json(content_type=None)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return None
        return event_source(answer, replica.url)

    def _follow(self, replica: ReplicaState, source: EventSource) -> None:
        if self._context is None:
            self._context = zmq.asyncio.Context()
        socket = self._context.socket(zmq.SUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt_string(zmq.SUBSCRIBE, source.topic)
        socket.connect(source.endpoint)
        self._cache.start(replica.replica_id)
        log.info(
            "following the KV events of replica %s (%s) at %s", replica.name, replica.url, source.endpoint
        )
        task = asyncio.create_task(self._read(replica, socket), name=f"kvgate-kv-events-{replica.name}")
        self._followed[replica.replica_id] = task

    async def _read(self, replica: ReplicaState, socket: zmq.asyncio.Socket) -> None:
        replica_id, pool = replica.replica_id, replica.pool
        cache, count = self._cache, self._metrics.count_kv_events
        expected: int | None = None
        try:
            while True:
                frames = await socket.recv_multipart()
                if len(frames) != 3:
                    count(pool, "undecodable")
                    continue
                try:
                    seq = sequence_number(frames[1])
                    batch = decode_batch(frames[2])
                except KvEventError:
                    count(pool, "undecodable")
                    continue
                if expected is not None and seq != expected:
                    cache.start(replica_id)
                    count(pool, "gap")
                expected = seq + 1
                for event in batch.events:
                    applied = cache.apply(replica_id, event)
                    if applied.stored:
                        count(pool, "stored", applied.stored)
                    if applied.removed:
                        count(pool, "removed", applied.removed)
                    if applied.unlinked:
                        count(pool, "unlinked", applied.unlinked)
                    if applied.cleared:
                        count(pool, "cleared")
        finally:
            socket.close(linger=0)

    async def _stop(self, replica_id: str) -> None:
        task = self._followed.pop(replica_id)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        self._cache.forget(replica_id)

    async def close(self) -> None:
        for replica_id in list(self._followed):
            await self._stop(replica_id)
        if self._context is not None:
            self._context.term()
            self._context = None
