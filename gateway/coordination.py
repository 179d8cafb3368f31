"""Sharing reservations between gateway processes through Redis.

Each gateway keeps its own ledger in memory and decides on it synchronously; this module makes the
other gateways' reservations visible to it. Every ``interval_s`` a gateway writes its per-replica
load to one Redis hash under a key that expires after ``lease_s``, and reads the other gateways'
hashes. A gateway that crashes stops renewing its key, so its reservations vanish from everyone's
view within one lease. When Redis is unreachable the gateway keeps serving on local state: the
foreign load it last saw ages out after one lease, and it says so in ``connected``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from routing.replica import ReplicaLoad

log = logging.getLogger("kvgate.coordination")


def _encode(load: ReplicaLoad) -> bytes:
    return orjson.dumps(
        [
            load.prefill_tokens_pending,
            load.resident_sequences,
            load.remaining_decode_tokens,
            load.reserved_kv_tokens,
        ]
    )


def _decode(raw: bytes) -> ReplicaLoad:
    prefill, sequences, decode, reserved = orjson.loads(raw)
    return ReplicaLoad(int(prefill), int(sequences), int(decode), int(reserved))


def _add(a: ReplicaLoad, b: ReplicaLoad) -> ReplicaLoad:
    return ReplicaLoad(
        a.prefill_tokens_pending + b.prefill_tokens_pending,
        a.resident_sequences + b.resident_sequences,
        a.remaining_decode_tokens + b.remaining_decode_tokens,
        a.reserved_kv_tokens + b.reserved_kv_tokens,
    )


@dataclass
class RedisCoordinator:
    """Publishes this gateway's per-replica load and sums every other live gateway's."""

    url: str
    local_loads: Callable[[], Mapping[str, ReplicaLoad]]
    interval_s: float = 0.5
    lease_s: float = 5.0
    namespace: str = "kvgate"
    """Key prefix: gateways that share a fleet share a namespace."""
    gateway_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    connected: bool = False
    _foreign: dict[str, ReplicaLoad] = field(default_factory=dict)
    _foreign_seen_at_s: float = 0.0
    _client: aioredis.Redis | None = None
    _task: asyncio.Task[None] | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}:gateway:{self.gateway_id}"

    def foreign_loads(self) -> Mapping[str, ReplicaLoad]:
        """Other gateways' reservations per replica; empty once the last sync is a lease old."""
        if time.monotonic() - self._foreign_seen_at_s > self.lease_s:
            return {}
        return self._foreign

    async def start(self) -> None:
        self._client = aioredis.from_url(self.url, socket_timeout=1.0, socket_connect_timeout=1.0)
        await self.sync_once()
        self._task = asyncio.create_task(self._run(), name="kvgate-coordination")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._client is not None:
            with contextlib.suppress(RedisError, OSError):
                await self._client.delete(self.key)
            await self._client.aclose()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.sync_once()

    async def sync_once(self) -> None:
        """Publish our load, renew our lease, and read everyone else's."""
        assert self._client is not None, "start() first"
        try:
            await self._publish(self._client)
            self._foreign = await self._read_others(self._client)
            self._foreign_seen_at_s = time.monotonic()
            if not self.connected:
                log.info("coordination: connected to Redis as gateway %s", self.gateway_id)
            self.connected = True
        except (RedisError, OSError) as exc:
            if self.connected:
                log.warning("coordination: Redis unreachable, serving on local state: %s", exc)
            self.connected = False

    async def _publish(self, client: aioredis.Redis) -> None:
        loads = {replica: _encode(load) for replica, load in self.local_loads().items()}
        async with client.pipeline(transaction=True) as pipe:
            pipe.delete(self.key)
            if loads:
                pipe.hset(self.key, mapping=loads)  # type: ignore[arg-type]
                pipe.pexpire(self.key, int(self.lease_s * 1000))
            await pipe.execute()

    async def _read_others(self, client: aioredis.Redis) -> dict[str, ReplicaLoad]:
        totals: dict[str, ReplicaLoad] = {}
        async for raw_key in client.scan_iter(match=f"{self.namespace}:gateway:*", count=100):
            key = raw_key.decode() if isinstance(raw_key, bytes) else str(raw_key)
            if key == self.key:
                continue
            entries = await client.hgetall(key)
            for replica, raw in entries.items():
                name = replica.decode() if isinstance(replica, bytes) else replica
                load = _decode(raw.encode() if isinstance(raw, str) else raw)
                totals[name] = _add(totals.get(name, ReplicaLoad()), load)
        return totals
