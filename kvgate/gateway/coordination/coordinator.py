"""Capacity claims through Redis: many gateways in front of one fleet admit as one.

Each gateway admits on its own ledger, synchronously, within its *claim* on every replica (a share of
the replica's KV tokens and sequence slots; ``kvgate.admission.claims`` sizes it and says why). This module
is the thin I/O around it: every ``interval_s``, and at once when the gateway has demand its claims
cannot meet (``top_up``), one Lua script call (``_CLAIM``) renews this gateway's claims, grants
what it asks for as far as the other live claims leave room, drops claims whose lease ran out, and
answers what the others hold and want. The script runs atomically, so the claims on a replica never
sum to more than its capacity, whichever gateways race. Nothing on a request's path waits on Redis.

Keys: one hash per replica, ``{namespace}:claims:<replica id>``, one field per gateway (its claim,
what it wants and uses, the capacity it sees and the claim's expiry on Redis's clock); the hash tag
keeps every key of a namespace in one Redis Cluster slot. A gateway that dies stops renewing and its
claims lapse within one lease; one that stops deletes its fields; a hash with no writer left expires.

One sync reads a bounded amount whatever is stored: at most ``MAX_GATEWAYS`` fields per replica (a
bigger hash, or a key of the wrong type, leaves the replica unclaimed and is counted as
``bad_value``); a field that is not a claim is dropped, counted and logged. Redis failing never
stops the gateway starting or serving: each failure is counted by kind and logged at most once per
kind every ``ERROR_LOG_INTERVAL_S`` (with the number held back), each change between seeing the
others and not is always logged, and ``kvgate.admission.coordination_gate.CoordinationGate`` decides what a
new request gets meanwhile (``fail_mode``). When Redis comes back (emptied, say, by a restart) the next sync
claims again, at least what each gateway uses; nothing restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

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

from kvgate.admission.claims import ClaimBook, Grant, ReplicaDemand, Share, replica_capacity, spread
from kvgate.admission.controller import AdmissionController
from kvgate.admission.coordination_gate import CoordinationGate, CoordinationStatus, FailMode
from kvgate.admission.decision import Refusal
from kvgate.admission.promises import Promise, PromiseBook, PromiseKey
from kvgate.admission.tenants import TenantDirectory
from kvgate.gateway.state import GatewayState
from kvgate.gateway.telemetry.metrics import GatewayMetrics
from kvgate.vocabulary.clock import Clock
from kvgate.vocabulary.replica import ReplicaLoad

log = logging.getLogger("kvgate.coordination")

MAX_GATEWAYS = 256
"""Fields of one replica's claims hash a sync reads; a bigger hash is broken or hostile."""
MAX_VALUE = 1 << 40
"""Above this (about 10^12 tokens) a stored number is not part of a claim."""
ERROR_LOG_INTERVAL_S = 30.0
DEMAND_WINDOW_S = 1.0
"""Requests refused for capacity count as this gateway's unmet demand for this long."""
TOP_UP_MIN_GAP_S = 0.02
TOP_UP_WAIT_SYNCS = 4
"""Syncs a request no claim can hold waits for its gateway's claims to grow, at most."""
"""Least time between two syncs, so that a burst of unmet demand asks Redis once, not per request."""
MAX_PROMISES = 10000
"""Promises one sync reads, earliest slot first."""
PROMISE_KEYS_TTL_MS = 600_000
"""The promise sets outlive their last writer by this long (longer than any Retry-After cap)."""
UNCLAIMED = ReplicaLoad(0, MAX_VALUE, 0, MAX_VALUE)
"""The load a replica this gateway holds no claim on stands at: full, whatever its capacity."""
_CLAIM = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me, lease, most, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {}
for i = 1, #KEYS do
  local a = 4 + (i - 1) * 8
  local key = KEYS[i]
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= 'hash' and kind ~= 'none' then
    out[i] = {-1}
  elseif redis.call('HLEN', key) > most then
    out[i] = {-2}
  else
    local cap_kv, cap_seq = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
    local o_kv, o_seq, o_used, bad, wants = 0, 0, 0, 0, {}
    local fields = redis.call('HGETALL', key)
    for j = 1, #fields, 2 do
      if fields[j] ~= me then
        local v = {}
        for word in string.gmatch(fields[j + 1], '[^ ]+') do v[#v + 1] = tonumber(word) end
        local ok = #v == 9
        for k = 1, #v do
          if v[k] < 0 or (k < 9 and v[k] > limit) or v[k] ~= math.floor(v[k]) then ok = false end
        end
        if not ok then
          bad = bad + 1
          redis.call('HDEL', key, fields[j])
        elseif v[9] <= now then
          redis.call('HDEL', key, fields[j])
        else
          o_kv, o_seq, o_used = o_kv + v[1], o_seq + v[2], o_used + v[5]
          cap_kv, cap_seq = math.min(cap_kv, v[7]), math.min(cap_seq, v[8])
          wants[#wants + 1] = v[3]
          wants[#wants + 1] = v[4]
        end
      end
    end
    local g_kv = math.max(0, math.min(tonumber(ARGV[a + 1]), cap_kv - o_kv))
    local g_seq = math.max(0, math.min(tonumber(ARGV[a + 2]), cap_seq - o_seq))
    local value = string.format('%d %d %s %s %s %s %s %s %d', g_kv, g_seq, ARGV[a + 5], ARGV[a + 6],
      ARGV[a + 7], ARGV[a + 8], ARGV[a + 3], ARGV[a + 4], now + lease)
    redis.call('HSET', key, me, value)
    redis.call('PEXPIRE', key, lease)
    out[i] = {g_kv, g_seq, o_kv, o_seq, bad, wants, o_used}
  end
end
return out
"""
"""Claim per replica, atomically: drop the other fields that are not claims or whose lease ran out,
grant what this gateway asks for up to what the other claims leave of the smallest capacity any live
gateway sees, store it with its expiry, and answer the grant, the others' claims and wants, and the
KV tokens the others' reservations use."""


def claims_key(namespace: str, replica_id: str) -> str:
    """The hash of every gateway's claim on ``replica_id``."""
    return f"{{{namespace}}}:claims:{replica_id}"


def promises_key(namespace: str) -> str:
    """The sorted set of every gateway's open promises, scored by slot time (epoch ms)."""
    return f"{{{namespace}}}:promises"


def kept_key(namespace: str) -> str:
    """The sorted set of promises kept by a gateway other than the one that booked them."""
    return f"{{{namespace}}}:promises:kept"


def _promise_member(gateway_id: str, key: PromiseKey, due_ms: int) -> str:
    return f"{gateway_id} {key[0].encode().hex()} {key[1].hex()} {due_ms}"


def _parse_promise(member: bytes) -> tuple[str, PromiseKey, int] | None:
    """(booking gateway, promise key, slot in epoch ms) of a stored promise, or None."""
    try:
        gateway_id, tenant, key, due_ms = member.decode().split(" ")
        return gateway_id, (bytes.fromhex(tenant).decode(), bytes.fromhex(key)), int(due_ms)
    except ValueError:
        return None


class ClaimedLoads(Mapping[str, ReplicaLoad]):
    """What lies outside this gateway's claims, per replica, as load (``ClaimBook.others_load``); a
    replica it holds no claim on (new since the last sync) reads as full (``UNCLAIMED``), never as
    free, so the fleet's views (``kvgate.gateway.replicas.fleet``) admit only within granted claims."""

    def __init__(self, loads: Mapping[str, ReplicaLoad]) -> None:
        self._loads = loads

    def __getitem__(self, replica_id: str) -> ReplicaLoad:
        return self._loads.get(replica_id, UNCLAIMED)

    def get(self, replica_id: str, default: object = None) -> ReplicaLoad:
        """Every replica has a load here (``UNCLAIMED`` when unknown); one call on the hot path."""
        return self._loads.get(replica_id, UNCLAIMED)

    def __iter__(self) -> Iterator[str]:
        return iter(self._loads)

    def __len__(self) -> int:
        return len(self._loads)

    def __bool__(self) -> bool:
        return True


def fleet_demands(
    state: GatewayState, controller: AdmissionController, now_s: float
) -> dict[str, ReplicaDemand]:
    """This gateway's demand on every replica whose capacity is known: what its reservations use
    there, and its unmet demand (queued, and refused with a promise) spread by capacity."""
    capacities = {
        r.replica_id: replica_capacity(
            r.kv_capacity_tokens, r.max_sequences, controller.guard_sequences(r.replica_id)
        )
        for r in state.replicas.values()
        if r.kv_capacity_tokens > 0
    }
    unmet_kv_tokens, unmet_requests = controller.unmet(now_s)
    unmet = spread(Share(unmet_kv_tokens, unmet_requests), capacities)
    loads = state.ledger.loads
    demands = {}
    for replica_id, capacity in capacities.items():
        load = loads.get(replica_id)
        used = Share() if load is None else Share(load.reserved_kv_tokens, load.resident_sequences)
        demands[replica_id] = ReplicaDemand(capacity, used, unmet[replica_id])
    return demands


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


def _grant(answer: Any) -> Grant | str:
    """One replica's answer from ``_CLAIM``, or why it claims nothing."""
    if answer[0] == -1:
        return "the key is not a hash"
    if answer[0] == -2:
        return f"over {MAX_GATEWAYS} gateways claim the replica"
    g_kv, g_seq, o_kv, o_seq, _, wants, o_used = answer
    others_want = tuple(Share(int(wants[i]), int(wants[i + 1])) for i in range(0, len(wants) - 1, 2))
    return Grant(Share(int(g_kv), int(g_seq)), Share(int(o_kv), int(o_seq)), others_want, int(o_used))


@dataclass
class _Answer:
    grants: dict[str, Grant | None] = field(default_factory=dict)
    bad: list[str] = field(default_factory=list)
    """What was skipped, one line per replica."""
    bad_values: int = 0
    """Values skipped: each field that was not a claim, each key that is not a claims hash."""


@dataclass
class RedisCoordinator:
    """Keeps this gateway's claims on the fleet's replicas, renewed and sized in the background."""

    url: str
    demands: Callable[[], Mapping[str, ReplicaDemand]]
    interval_s: float = 0.5
    lease_s: float = 5.0
    namespace: str = "kvgate"
    """Key prefix: gateways that share a fleet share a namespace."""
    fail_mode: FailMode = FailMode.OPEN
    metrics: GatewayMetrics | None = None
    clock: Clock = time.monotonic
    """The gateway's clock: what the decision path compares the last sync with."""
    gateway_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    connected: bool = False
    """The latest sync reached Redis and read it."""
    last_sync_s: float | None = None
    """When (``clock``) the last good sync *began*: its claims are valid for one lease from then."""
    book: ClaimBook = field(default_factory=ClaimBook)
    syncs: int = 0
    """Good syncs since start."""
    promises: PromiseBook | None = None
    """This gateway's promises, shared with the other gateways' (``kvgate.admission.promises``)."""
    tenants: TenantDirectory | None = None
    """Its tenants' budgets, of which it holds 1/N of N live gateways (``TenantDirectory.share``)."""
    gateways: int = 1
    """Live gateways in the namespace, this one included, as the last sync saw them."""
    _published: dict[str, Promise] = field(default_factory=dict)
    """Promises this gateway booked and told the others of, by their stored member."""
    _learnt: dict[PromiseKey, str] = field(default_factory=dict)
    """Other gateways' promises read at the last sync: key -> stored member."""
    _foreign: ClaimedLoads = field(default_factory=lambda: ClaimedLoads({}))
    _refused: deque[tuple[float, Share]] = field(default_factory=deque)
    """(when, what) of the requests refused for capacity in the last ``DEMAND_WINDOW_S``."""
    _up: bool | None = None
    """The state last logged: None before the first sync."""
    _throttled: _Throttled = field(default_factory=lambda: _Throttled(ERROR_LOG_INTERVAL_S))
    _client: aioredis.Redis | None = None
    _script: Any = None
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None
    _synced: asyncio.Future[None] | None = None
    """Resolved when the sync in progress or next ends (``top_up_now`` waits on it)."""
    gate: CoordinationGate = field(init=False)

    def __post_init__(self) -> None:
        self.gate = CoordinationGate(self.fail_mode, self.lease_s, retry_after_s=self.interval_s)
        if self.promises is not None:
            self.promises.shared = True

    def key(self, replica_id: str) -> str:
        return claims_key(self.namespace, replica_id)

    def others_used(self) -> Mapping[str, int]:
        """KV tokens the other gateways' reservations hold per replica (for the occupancy estimate,
        not for admission); empty once the last sync is a lease old."""
        if self.last_sync_s is None or self.clock() - self.last_sync_s > self.lease_s:
            return {}
        return self.book.others_used

    def foreign_loads(self) -> Mapping[str, ReplicaLoad]:
        """What lies outside this gateway's claims, per replica; empty once the last sync is a lease
        old (the gateway is blind: ``fail_mode`` open admits on its own ledger alone)."""
        if self.last_sync_s is None or self.clock() - self.last_sync_s > self.lease_s:
            return {}
        return self._foreign

    def top_up(self, kv_tokens: int, sequences: int) -> None:
        """Demand the claims cannot meet arrived: sync now rather than at the next interval. A
        refused request (``kv_tokens`` > 0) counts as unmet demand for ``DEMAND_WINDOW_S``: a
        gateway that holds no room refuses without queueing, and would otherwise never ask for any."""
        if kv_tokens or sequences:
            self._refused.append((self.clock(), Share(kv_tokens, sequences)))
        self._wake.set()

    async def top_up_now(self, kv_tokens: int, sequences: int) -> bool:
        """Sync now (and again, up to ``TOP_UP_WAIT_SYNCS`` syncs or two intervals, while another
        gateway gives the room back); True once a claim grew. Only a request its gateway could not
        otherwise place waits on this."""
        before = self.book.claimed()
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + 2 * self.interval_s + TOP_UP_MIN_GAP_S
        self.top_up(kv_tokens, sequences)
        for _ in range(TOP_UP_WAIT_SYNCS):
            synced = self._synced
            if synced is None or synced.done():
                synced = self._synced = loop.create_future()
            self._wake.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(synced), max(0.0, deadline_s - loop.time()))
            after = self.book.claimed()
            if any(c.kv_tokens > before.get(r, Share()).kv_tokens for r, c in after.items()):
                return True
            if loop.time() >= deadline_s:
                return False
        return False

    def _with_refused(self, demands: Mapping[str, ReplicaDemand], now_s: float) -> dict[str, ReplicaDemand]:
        refused = self._refused
        while refused and refused[0][0] < now_s - DEMAND_WINDOW_S:
            refused.popleft()
        if not refused:
            return dict(demands)
        total = Share()
        for _, share in refused:
            total = total + share
        extra = spread(total, {r: d.capacity for r, d in demands.items()})
        return {r: dataclasses.replace(d, unmet=d.unmet + extra[r]) for r, d in demands.items()}

    def refusal(self, now_s: float) -> Refusal | None:
        """The 503 a new request gets now (``fail_mode: closed`` while the others are unseen)."""
        return self.gate.refusal(now_s, self.connected, self.last_sync_s)

    def status(self) -> CoordinationStatus:
        status = self.gate.status(self.clock(), self.connected, self.last_sync_s)
        claims = tuple((r, c.kv_tokens, c.sequences) for r, c in sorted(self.book.claimed().items()))
        return dataclasses.replace(status, gateways=self.gateways, claims=claims)

    async def start(self) -> None:
        """Connect and claim once; whatever Redis does, this returns and the loop keeps trying."""
        self._client = aioredis.from_url(
            self.url,
            socket_timeout=1.0,
            socket_connect_timeout=1.0,
            retry=Retry(NoBackoff(), 0),
        )
        self._script = self._client.register_script(_CLAIM)
        await self.sync_once()
        self._task = asyncio.create_task(self._run(), name="kvgate-coordination")

    async def stop(self) -> None:
        """Stop syncing and give every claim back at once (a killed gateway's lapse in a lease)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._client is not None:
            replicas = list(self.book.held)
            self.book.held.clear()
            self._foreign = ClaimedLoads({})
            with contextlib.suppress(RedisError, OSError):
                async with self._client.pipeline(transaction=True) as pipe:
                    for replica_id in replicas:
                        pipe.hdel(self.key(replica_id), self.gateway_id)
                    await pipe.execute()
            with contextlib.suppress(RedisError, OSError):
                await self._client.aclose()
            self._client = None

    async def _run(self) -> None:
        task = asyncio.current_task()
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await self._wake.wait()
            self._wake.clear()
            await self.sync_once()
            if task is not None and task.cancelling():
                # On Python 3.11, redis-py's asyncio.wait_for can lose a cancellation that lands
                # as its write completes; the request is still counted, so honour it here.
                raise asyncio.CancelledError
            await asyncio.sleep(TOP_UP_MIN_GAP_S)

    async def sync_once(self) -> None:
        """Size the claims on this gateway's demand and what the others want, shrink locally what
        shrinks, and ask Redis; what it grants is usable from its answer on."""
        synced, self._synced = self._synced, None
        try:
            await self._sync()
        finally:
            if synced is not None and not synced.done():
                synced.set_result(None)

    async def _sync(self) -> None:
        assert self._client is not None, "start() first"
        asked_at_s = self.clock()
        demands = self._with_refused(self.demands(), asked_at_s)
        asked = self.book.plan(demands)
        self._foreign = ClaimedLoads(self.book.others_load())
        try:
            answer = await self._claim(demands, asked)
            if self.promises is not None:
                answer.bad_values += await self._share_promises(self.promises)
        except Exception as exc:
            self._failed(exc)
            return
        self.book.granted(answer.grants, {r: demands[r].capacity for r in answer.grants})
        self._foreign = ClaimedLoads(self.book.others_load())
        self.last_sync_s = asked_at_s
        self.connected = True
        self.syncs += 1
        now_s = self.clock()
        self.gateways = 1 + max((len(g.others_want) for g in answer.grants.values() if g), default=0)
        if self.tenants is not None:
            self.tenants.share(self.gateways, now_s)
        if answer.bad_values:
            if self.metrics is not None:
                self.metrics.count_coordination_errors("bad_value", answer.bad_values)
            self._throttled.warn(
                "bad_value",
                now_s,
                f"skipped {answer.bad_values} bad value(s) under namespace {self.namespace!r}, "
                f"counting the rest; first: {answer.bad[0] if answer.bad else 'a stored promise'}",
            )
        if self._up is not True:
            log.info(
                "coordination up: gateway %s claims on %d replica(s) beside %d other gateway(s) in "
                "namespace %r",
                self.gateway_id,
                len(answer.grants),
                self.gateways - 1,
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
                else "admitting on local state alone once its claims' lease runs out (fail_mode open)"
            )
            log.warning("coordination down (%s: %s): %s", kind, detail, effect)
            self._up = False

    async def _claim(self, demands: Mapping[str, ReplicaDemand], asked: Mapping[str, Share]) -> _Answer:
        answer = _Answer()
        if not asked:
            await self._client.ping()  # type: ignore[union-attr]
            return answer
        replicas = list(asked)
        args: list[Any] = [self.gateway_id, int(self.lease_s * 1000), MAX_GATEWAYS, MAX_VALUE]
        for replica_id in replicas:
            demand = demands[replica_id]
            ask, capacity, want, used = asked[replica_id], demand.capacity, demand.want, demand.used
            args += [ask.kv_tokens, ask.sequences, capacity.kv_tokens, capacity.sequences]
            args += [want.kv_tokens, want.sequences, used.kv_tokens, used.sequences]
        results = await self._script(keys=[self.key(r) for r in replicas], args=args, client=self._client)
        for replica_id, result in zip(replicas, results, strict=True):
            grant = _grant(result)
            if isinstance(grant, str):
                answer.bad.append(f"replica {replica_id!r}: {grant}")
                answer.bad_values += 1
                answer.grants[replica_id] = None
                continue
            answer.grants[replica_id] = grant
            dropped = int(result[4])
            if dropped:
                answer.bad_values += dropped
                answer.bad.append(f"replica {replica_id!r}: dropped {dropped} field(s) that are not claims")
        return answer

    async def _share_promises(self, book: PromiseBook) -> int:
        """Tell the others of the promises booked here and of theirs kept here; learn theirs; drop
        ours that were kept elsewhere. Slots travel as epoch milliseconds. Returns the stored
        promises skipped as unreadable."""
        assert self._client is not None
        booked, kept = book.take_news()
        offset_s = time.time() - self.clock()
        now_ms = int(time.time() * 1000)
        grace_ms = int(book.grace_s * 1000)
        open_key, done_key = promises_key(self.namespace), kept_key(self.namespace)
        async with self._client.pipeline(transaction=False) as pipe:
            for promise in booked:
                due_ms = int((promise.due_s + offset_s) * 1000)
                member = _promise_member(self.gateway_id, promise.key, due_ms)
                self._published[member] = promise
                pipe.zadd(open_key, {member: due_ms})
            for key in kept:
                theirs = self._learnt.get(key)
                if theirs is not None:
                    pipe.zadd(done_key, {theirs: now_ms})
                    pipe.zrem(open_key, theirs)
            pipe.zremrangebyscore(open_key, "-inf", now_ms - grace_ms)
            pipe.zremrangebyscore(done_key, "-inf", now_ms - int(self.lease_s * 1000))
            pipe.pexpire(open_key, PROMISE_KEYS_TTL_MS)
            pipe.pexpire(done_key, PROMISE_KEYS_TTL_MS)
            pipe.zrangebyscore(open_key, now_ms - grace_ms, "+inf", start=0, num=MAX_PROMISES)
            pipe.zrange(done_key, 0, MAX_PROMISES - 1)
            *_, stored, done = await pipe.execute()
        bad = 0
        learnt: dict[PromiseKey, str] = {}
        for raw in stored:
            parsed = _parse_promise(raw)
            if parsed is None:
                bad += 1
                continue
            gateway_id, key, due_ms = parsed
            if gateway_id != self.gateway_id:
                learnt[key] = raw.decode()
                book.learn(key, due_ms / 1000.0 - offset_s)
        self._learnt = learnt
        ours = [raw.decode() for raw in done if raw.decode() in self._published]
        for member in ours:
            book.remove(self._published.pop(member))
        if ours:
            await self._client.zrem(done_key, *ours)
        now_s = self.clock()
        for member, promise in list(self._published.items()):
            if promise.due_s + book.grace_s < now_s:
                del self._published[member]
        return bad
