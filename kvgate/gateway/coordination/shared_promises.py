"""Promises shared between gateways through Redis: a client told to come back may come back to any.

A promise this gateway booked is published to a sorted set scored by its slot (epoch milliseconds,
so gateways whose monotonic clocks differ agree); the others' are learnt at each sync, so a client
coming back to another gateway claims its slot there; a promise kept elsewhere is moved to a second
set, where the gateway that booked it hears of it and drops it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from kvgate.admission.promises import Promise, PromiseBook, PromiseKey
from kvgate.vocabulary.clock import Clock

MAX_PROMISES = 10000
"""Promises one sync reads, earliest slot first."""
PROMISE_KEYS_TTL_MS = 600_000
"""The promise sets outlive their last writer by this long (longer than any Retry-After cap)."""


def promises_key(namespace: str) -> str:
    """The sorted set of every gateway's open promises, scored by slot time (epoch ms)."""
    return f"{{{namespace}}}:promises"


def kept_key(namespace: str) -> str:
    """The sorted set of promises kept by a gateway other than the one that booked them."""
    return f"{{{namespace}}}:promises:kept"


def _member(gateway_id: str, key: PromiseKey, due_ms: int) -> str:
    return f"{gateway_id} {key[0].encode().hex()} {key[1].hex()} {due_ms}"


def _parse(member: bytes) -> tuple[str, PromiseKey, int] | None:
    """(booking gateway, promise key, slot in epoch ms) of a stored promise, or None."""
    try:
        gateway_id, tenant, key, due_ms = member.decode().split(" ")
        return gateway_id, (bytes.fromhex(tenant).decode(), bytes.fromhex(key)), int(due_ms)
    except ValueError:
        return None


@dataclass
class SharedPromises:
    """One gateway's side of the shared promises: what it published, what it learnt."""

    gateway_id: str
    namespace: str
    lease_s: float
    clock: Clock
    published: dict[str, Promise] = field(default_factory=dict)
    """Promises this gateway booked and told the others of, by their stored member."""
    learnt: dict[PromiseKey, str] = field(default_factory=dict)
    """Other gateways' promises read at the last sync: key -> stored member."""

    async def share(self, client: aioredis.Redis, book: PromiseBook) -> int:
        """Tell the others of the promises booked here and of theirs kept here; learn theirs; drop
        ours that were kept elsewhere. Slots travel as epoch milliseconds. Returns the stored
        promises skipped as unreadable."""
        booked, kept = book.take_news()
        offset_s = time.time() - self.clock()
        now_ms = int(time.time() * 1000)
        grace_ms = int(book.grace_s * 1000)
        open_key, done_key = promises_key(self.namespace), kept_key(self.namespace)
        async with client.pipeline(transaction=False) as pipe:
            for promise in booked:
                due_ms = int((promise.due_s + offset_s) * 1000)
                member = _member(self.gateway_id, promise.key, due_ms)
                self.published[member] = promise
                pipe.zadd(open_key, {member: due_ms})
            for key in kept:
                theirs = self.learnt.get(key)
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
            parsed = _parse(raw)
            if parsed is None:
                bad += 1
                continue
            gateway_id, key, due_ms = parsed
            if gateway_id != self.gateway_id:
                learnt[key] = raw.decode()
                book.learn(key, due_ms / 1000.0 - offset_s)
        self.learnt = learnt
        ours = [raw.decode() for raw in done if raw.decode() in self.published]
        for member in ours:
            book.remove(self.published.pop(member))
        if ours:
            await client.zrem(done_key, *ours)
        now_s = self.clock()
        for member, promise in list(self.published.items()):
            if promise.due_s + book.grace_s < now_s:
                del self.published[member]
        return bad
