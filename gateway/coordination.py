"""Sharing reservations between gateway processes through Redis.

Each gateway keeps its own ledger in memory and decides on it synchronously; this module makes the
other gateways' reservations visible to it. Every ``interval_s`` a gateway writes its per-replica
load to one Redis hash (``gateway_key``) that expires after ``lease_s``, lists itself in the
namespace's registry (``registry_key``, a sorted set scored by publish time), and reads the hashes
of the gateways listed there. A gateway that crashes stops renewing its hash, so its reservations
vanish from everyone's view within one lease; the next reader drops it from the registry.

One sync reads a bounded amount whatever is stored: at most ``MAX_GATEWAYS`` registry members (the
most recent), only hashes of at most ``MAX_REPLICAS_PER_GATEWAY`` fields, and ``MAX_FIELDS_PER_SYNC``
fields in all. An entry that is not
a load (not JSON, wrong shape, a negative or absurd number, a replica name that is not UTF-8), a
hash that is too big or a key of the wrong type is skipped on its own, counted as ``bad_value`` and
logged; the rest still counts. Redis failing never stops the gateway starting or serving: each
failure is counted by kind and logged at most once per kind every ``ERROR_LOG_INTERVAL_S`` (with
the number held back), each change between seeing the others and not is always logged, and
``admission.coordination.CoordinationGate`` decides what a new request gets meanwhile
(``fail_mode``). When Redis comes back the next sync publishes and reads again; nothing restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from admission.coordination import CoordinationGate, CoordinationStatus, FailMode
from admission.decision import Refusal
from gateway.metrics import GatewayMetrics
from vocabulary.replica import ReplicaLoad

log = logging.getLogger("kvgate.coordination")

MAX_GATEWAYS = 256
"""Registry members one sync reads, newest first; a namespace with more is broken or hostile."""
MAX_REPLICAS_PER_GATEWAY = 4096
"""Fields of one gateway's hash one sync reads; a bigger hash is skipped as a bad value."""
MAX_FIELDS_PER_SYNC = 65536
"""Fields one sync reads in all, newest gateways first; the hashes past it are skipped as bad values."""
MAX_LOAD_VALUE = 1 << 40
"""Above this (about 10^12 tokens) a published number is not a load."""
ERROR_LOG_INTERVAL_S = 30.0
REGISTRY_MIN_TTL_S = 60.0
"""The registry outlives every gateway of the namespace by at least this long."""
_PRUNE = """
local removed = 0
for i = 2, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 0 then
    removed = removed + redis.call('ZREM', KEYS[1], ARGV[i - 1])
  end
end
return removed
"""
"""Drop registry members whose hash has expired, atomically: a member that publishes again between
the read and the prune keeps its place."""


def gateway_key(namespace: str, gateway_id: str) -> str:
    """The hash where gateway ``gateway_id`` publishes its per-replica load."""
    return f"{namespace}:gateway:{gateway_id}"


def registry_key(namespace: str) -> str:
    """The sorted set of the namespace's gateway ids, scored by their last publish (wall clock)."""
    return f"{namespace}:gateways"


def _encode(load: ReplicaLoad) -> bytes:
    return orjson.dumps(
        [
            load.pending_prompt_tokens,
            load.resident_sequences,
            load.remaining_decode_tokens,
            load.reserved_kv_tokens,
        ]
    )


def _decode(raw: bytes) -> ReplicaLoad | str:
    """The load another gateway published, or why the value is not one."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return "not JSON"
    if not isinstance(value, list) or len(value) != 4:
        return "not a list of 4 numbers"
    if not all(type(v) is int and 0 <= v <= MAX_LOAD_VALUE for v in value):
        return f"not 4 integers in 0..{MAX_LOAD_VALUE}"
    return ReplicaLoad(value[0], value[1], value[2], value[3])


def _add(a: ReplicaLoad, b: ReplicaLoad) -> ReplicaLoad:
    return ReplicaLoad(
        a.pending_prompt_tokens + b.pending_prompt_tokens,
        a.resident_sequences + b.resident_sequences,
        a.remaining_decode_tokens + b.remaining_decode_tokens,
        a.reserved_kv_tokens + b.reserved_kv_tokens,
    )


def error_kind(exc: BaseException) -> str:
    """The one place a Redis failure becomes a kind (``COORDINATION_ERROR_KINDS``)."""
    if isinstance(exc, AuthenticationError | AuthenticationWrongNumberOfArgsError):
        return "authentication"
    if isinstance(exc, RedisTimeoutError | TimeoutError):
        return "timeout"
    if isinstance(exc, RedisConnectionError | OSError):
        return "connection"
    if isinstance(exc, ResponseError):
        return "response"
    return "internal"


@dataclass
class _Throttled:
    """Log lines per kind, at most one per ``interval_s``; the next says how many were held back."""

    interval_s: float
    _last_s: dict[str, float] = field(default_factory=dict)
    _held: dict[str, int] = field(default_factory=dict)

    def warn(self, kind: str, now_s: float, message: str, *, exc_info: bool = False) -> None:
        last_s = self._last_s.get(kind)
        if last_s is not None and now_s - last_s < self.interval_s:
            self._held[kind] = self._held.get(kind, 0) + 1
            return
        self._last_s[kind] = now_s
        held = self._held.pop(kind, 0)
        suffix = f" ({held} more since the last report)" if held else ""
        log.warning("coordination: %s%s", message, suffix, exc_info=exc_info)


@dataclass
class _Read:
    """What one sync read of the other gateways: their summed loads and the entries it skipped."""

    totals: dict[str, ReplicaLoad] = field(default_factory=dict)
    bad: list[str] = field(default_factory=list)
    gateways: int = 0


@dataclass
class RedisCoordinator:
    """Publishes this gateway's per-replica load and sums every other live gateway's."""

    url: str
    local_loads: Callable[[], Mapping[str, ReplicaLoad]]
    interval_s: float = 0.5
    lease_s: float = 5.0
    namespace: str = "kvgate"
    """Key prefix: gateways that share a fleet share a namespace."""
    fail_mode: FailMode = FailMode.OPEN
    metrics: GatewayMetrics | None = None
    clock: Callable[[], float] = time.monotonic
    """The gateway's clock: what the decision path compares the last sync with."""
    gateway_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    connected: bool = False
    """The latest sync reached Redis and read it."""
    last_sync_s: float | None = None
    """When (``clock``) the last good sync ended; None before the first."""
    _foreign: dict[str, ReplicaLoad] = field(default_factory=dict)
    _up: bool | None = None
    """The state last logged: None before the first sync."""
    _throttled: _Throttled = field(default_factory=lambda: _Throttled(ERROR_LOG_INTERVAL_S))
    _client: aioredis.Redis | None = None
    _task: asyncio.Task[None] | None = None
    gate: CoordinationGate = field(init=False)

    def __post_init__(self) -> None:
        self.gate = CoordinationGate(self.fail_mode, self.lease_s, retry_after_s=self.interval_s)

    @property
    def key(self) -> str:
        return gateway_key(self.namespace, self.gateway_id)

    def foreign_loads(self) -> Mapping[str, ReplicaLoad]:
        """Other gateways' reservations per replica; empty once the last sync is a lease old."""
        if self.last_sync_s is None or self.clock() - self.last_sync_s > self.lease_s:
            return {}
        return self._foreign

    def refusal(self, now_s: float) -> Refusal | None:
        """The 503 a new request gets now (``fail_mode: closed`` while the others are unseen)."""
        return self.gate.refusal(now_s, self.connected, self.last_sync_s)

    def status(self) -> CoordinationStatus:
        return self.gate.status(self.clock(), self.connected, self.last_sync_s)

    async def start(self) -> None:
        """Connect and sync once; whatever Redis does, this returns and the loop keeps trying."""
        self._client = aioredis.from_url(
            self.url,
            socket_timeout=1.0,
            socket_connect_timeout=1.0,
            retry=Retry(NoBackoff(), 0),
        )
        await self.sync_once()
        self._task = asyncio.create_task(self._run(), name="kvgate-coordination")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._client is not None:
            with contextlib.suppress(RedisError, OSError):
                async with self._client.pipeline(transaction=True) as pipe:
                    pipe.delete(self.key)
                    pipe.zrem(registry_key(self.namespace), self.gateway_id)
                    await pipe.execute()
            with contextlib.suppress(RedisError, OSError):
                await self._client.aclose()
            self._client = None

    async def _run(self) -> None:
        task = asyncio.current_task()
        while True:
            await asyncio.sleep(self.interval_s)
            await self.sync_once()
            if task is not None and task.cancelling():
                # On Python 3.11, redis-py's asyncio.wait_for can lose a cancellation that lands
                # as its write completes; the request is still counted, so honour it here.
                raise asyncio.CancelledError

    async def sync_once(self) -> None:
        """Publish our load, renew our lease, and read everyone else's."""
        assert self._client is not None, "start() first"
        try:
            registered = await self._publish(self._client)
            read = await self._read_others(self._client, registered)
        except Exception as exc:
            self._failed(exc)
            return
        now_s = self.clock()
        self._foreign = read.totals
        self.last_sync_s = now_s
        self.connected = True
        if read.bad:
            if self.metrics is not None:
                self.metrics.count_coordination_errors("bad_value", len(read.bad))
            self._throttled.warn(
                "bad_value",
                now_s,
                f"skipped {len(read.bad)} bad value(s) under namespace {self.namespace!r}, "
                f"counting the rest; first: {read.bad[0]}",
            )
        if self._up is not True:
            log.info(
                "coordination up: gateway %s sees %d other gateway(s) in namespace %r",
                self.gateway_id,
                read.gateways,
                self.namespace,
            )
            self._up = True

    def _failed(self, exc: Exception) -> None:
        kind = error_kind(exc)
        self.connected = False
        if self.metrics is not None:
            self.metrics.count_coordination_errors(kind)
        detail = f"{type(exc).__name__}: {exc}"
        self._throttled.warn(kind, self.clock(), f"Redis {kind} error: {detail}", exc_info=kind == "internal")
        if self._up is not False:
            effect = (
                "refusing new requests (fail_mode closed)"
                if self.fail_mode is FailMode.CLOSED
                else "admitting on local state alone (fail_mode open)"
            )
            log.warning("coordination down (%s: %s): %s", kind, detail, effect)
            self._up = False

    async def _publish(self, client: aioredis.Redis) -> tuple[int, list[Any]]:
        """Write our load and registry entry; read the registry's size and newest members (bytes)."""
        loads = {replica: _encode(load) for replica, load in self.local_loads().items()}
        registry = registry_key(self.namespace)
        lease_ms = int(self.lease_s * 1000)
        async with client.pipeline(transaction=True) as pipe:
            pipe.delete(self.key)
            if loads:
                pipe.hset(self.key, mapping=loads)  # type: ignore[arg-type]
                pipe.pexpire(self.key, lease_ms)
                pipe.zadd(registry, {self.gateway_id: time.time()})
                pipe.pexpire(registry, max(int(REGISTRY_MIN_TTL_S * 1000), 10 * lease_ms))
            pipe.zcard(registry)
            pipe.zrevrange(registry, 0, MAX_GATEWAYS)
            results = await pipe.execute()
        return int(results[-2]), list(results[-1])

    async def _read_others(self, client: aioredis.Redis, registered: tuple[int, list[Any]]) -> _Read:
        read = _Read()
        count, members = registered
        own = self.gateway_id.encode()
        others = [m for m in members if m != own][:MAX_GATEWAYS]
        if count > MAX_GATEWAYS + 1:
            read.bad.append(f"{count} gateways registered, over {MAX_GATEWAYS}; read the newest")
        if not others:
            return read
        prefix = gateway_key(self.namespace, "").encode()
        keys = [prefix + m for m in others]
        async with client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hlen(key)
            sizes = await pipe.execute(raise_on_error=False)
        wanted: list[tuple[bytes, bytes]] = []
        gone: list[tuple[bytes, bytes]] = []
        budget = MAX_FIELDS_PER_SYNC
        for member, key, size in zip(others, keys, sizes, strict=True):
            if isinstance(size, ResponseError):
                read.bad.append(f"gateway {member!r}: {size}")
            elif isinstance(size, BaseException):
                raise size
            elif size == 0:
                gone.append((member, key))
            elif size > MAX_REPLICAS_PER_GATEWAY:
                read.bad.append(f"gateway {member!r}: {size} replicas, over {MAX_REPLICAS_PER_GATEWAY}")
            elif size > budget:
                read.bad.append(f"gateway {member!r}: past {MAX_FIELDS_PER_SYNC} fields in one sync")
            else:
                budget -= size
                wanted.append((member, key))
        async with client.pipeline(transaction=False) as pipe:
            for _, key in wanted:
                pipe.hgetall(key)
            if gone:
                registry = registry_key(self.namespace)
                pipe.eval(_PRUNE, 1 + len(gone), registry, *(k for _, k in gone), *(m for m, _ in gone))
            results = await pipe.execute(raise_on_error=False)
        for (member, _), entries in zip(wanted, results[: len(wanted)], strict=True):
            if isinstance(entries, BaseException):
                read.bad.append(f"gateway {member!r}: {entries}")
                continue
            read.gateways += 1
            self._add_entries(read, member, entries)
        return read

    @staticmethod
    def _add_entries(read: _Read, member: bytes, entries: Mapping[bytes, bytes]) -> None:
        totals = read.totals
        for raw_name, raw in entries.items():
            try:
                name = raw_name.decode()
            except UnicodeDecodeError:
                read.bad.append(f"gateway {member!r} replica {raw_name!r}: name not UTF-8")
                continue
            load = _decode(raw)
            if isinstance(load, str):
                read.bad.append(f"gateway {member!r} replica {name!r}: {load}")
                continue
            previous = totals.get(name)
            totals[name] = load if previous is None else _add(previous, load)
