"""Capacity claims through Redis: many gateways in front of one fleet admit as one.

Each gateway admits on its own ledger, synchronously, within its *claim* on every replica (a share of
the replica's KV tokens and sequence slots; ``kvgate.admission.claims`` sizes it and says why). This module
is the thin I/O around it: every ``interval_s``, and at once when the gateway has demand its claims
cannot meet (``top_up``), one call of the claims script (``claim_script.CLAIM``) renews this
gateway's claims and answers what the others hold and want, and the promises are shared
(``shared_promises``). Nothing on a request's path waits on Redis.

Keys: one hash per replica, ``{namespace}:claims:<replica id>``, one field per gateway (its claim,
what it wants and uses, the capacity it sees and the claim's expiry on Redis's clock); the hash tag
keeps every key of a namespace in one Redis Cluster slot. A gateway that dies stops renewing and its
claims lapse within one lease; one that stops deletes its fields; a hash with no writer left expires.

A field that is not a claim is dropped, counted and logged. Redis failing never
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
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from kvgate.admission.claims import ClaimBook, ReplicaDemand, Share, replica_capacity, spread
from kvgate.admission.controller import AdmissionController
from kvgate.admission.coordination_gate import CoordinationGate, CoordinationStatus, FailMode
from kvgate.admission.decision import Refusal
from kvgate.admission.promises import PromiseBook
from kvgate.admission.tenants import TenantDirectory
from kvgate.gateway.coordination.claim_script import (
    CLAIM,
    MAX_VALUE,
    ClaimAnswer,
    claim_args,
    claims_key,
    read_answer,
)
from kvgate.gateway.coordination.failures import Throttled, error_kind, log
from kvgate.gateway.coordination.shared_promises import SharedPromises
from kvgate.gateway.state import GatewayState
from kvgate.gateway.telemetry.metrics import GatewayMetrics
from kvgate.vocabulary.clock import Clock
from kvgate.vocabulary.replica import ReplicaLoad

ERROR_LOG_INTERVAL_S = 30.0
DEMAND_WINDOW_S = 1.0
"""Requests refused for capacity count as this gateway's unmet demand for this long."""
TOP_UP_MIN_GAP_S = 0.02
TOP_UP_WAIT_SYNCS = 4
"""Syncs a request no claim can hold waits for its gateway's claims to grow, at most."""
"""Least time between two syncs, so that a burst of unmet demand asks Redis once, not per request."""
UNCLAIMED = ReplicaLoad(0, MAX_VALUE, 0, MAX_VALUE)
"""The load a replica this gateway holds no claim on stands at: full, whatever its capacity."""


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
    _foreign: ClaimedLoads = field(default_factory=lambda: ClaimedLoads({}))
    _refused: deque[tuple[float, Share]] = field(default_factory=deque)
    """(when, what) of the requests refused for capacity in the last ``DEMAND_WINDOW_S``."""
    _up: bool | None = None
    """The state last logged: None before the first sync."""
    _throttled: Throttled = field(default_factory=lambda: Throttled(ERROR_LOG_INTERVAL_S))
    _client: aioredis.Redis | None = None
    _script: Any = None
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None
    _synced: asyncio.Future[None] | None = None
    """Resolved when the sync in progress or next ends (``top_up_now`` waits on it)."""
    gate: CoordinationGate = field(init=False)
    shared_promises: SharedPromises = field(init=False)

    def __post_init__(self) -> None:
        self.gate = CoordinationGate(self.fail_mode, self.lease_s, retry_after_s=self.interval_s)
        self.shared_promises = SharedPromises(self.gateway_id, self.namespace, self.lease_s, self.clock)
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
        self._script = self._client.register_script(CLAIM)
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
                answer.bad_values += await self.shared_promises.share(self._client, self.promises)
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

    async def _claim(self, demands: Mapping[str, ReplicaDemand], asked: Mapping[str, Share]) -> ClaimAnswer:
        if not asked:
            await self._client.ping()  # type: ignore[union-attr]
            return ClaimAnswer()
        replicas = list(asked)
        args = claim_args(self.gateway_id, self.lease_s, replicas, demands, asked)
        results = await self._script(keys=[self.key(r) for r in replicas], args=args, client=self._client)
        return read_answer(replicas, results)
