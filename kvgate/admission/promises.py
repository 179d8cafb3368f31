"""Retry-After as a promise: the slots booked for refused requests, and who may claim them.

Under sustained overload a correct drain-time estimate is still not a place in line: the capacity
that frees at the predicted instant goes to whoever asks then, usually a new arrival, and the client
that waited as told is refused again (14-28 % first-retry success at a 2 s queue limit). So a
refusal for capacity books the request a slot in a virtual queue of promised returns: the slot's
time is the drain estimate behind resident work, queued work and every promise of the same or a
higher priority booked before it, and that time is the Retry-After. The same request coming back
(same tenant and the same ``Idempotency-Key``, which a client sends with every attempt of one
request; or, from a client that sends none, such as the openai SDKs, the same body fingerprint and
saying it is a retry: ``x-stainless-retry-count`` of 1 or more) within ``grace_s`` of its slot
claims it and goes ahead of new arrivals and queued work of its own class, never ahead of a higher
class. Only a request that can be recognised is promised anything (its own key, or saying how often
it tried: without either, a retry could not be told from a new request with the same body), and a
promise never makes a request wait while there is room: one coming back early is admitted when it
would be admitted without the promise, which then lapses. While a promise is due (within ``grace_s``
of its time) the decision sets its KV aside on the simulated fleet before placing anything of the
same or a lower class, so the room is still there when the client comes back. A promise only orders:
admission still needs ``capacity.fits``, so it can never over-commit KV. Unclaimed promises are
released ``grace_s`` after their time; promises count against the queue's request and token bounds.
No promise is booked without its room: the promises whose windows overlap never hold more than
their share of the fleet, so a promise past the share moves to the first window that holds it
(``slot_s``), and one that no window within the cap holds is not booked and its client is told not
to retry. What became of each is counted when it is settled (``PromiseCounts``), with how far its
time was from its room (``ForecastErrors``).
Several gateways behind one Service honour each other's promises (``kvgate.gateway.coordination.coordinator``
carries them through Redis): a promise another gateway booked is *learnt* here by its key and slot time, so
the client coming back to this gateway claims it as it would have there (early, it is told to wait for its
slot; on time, it goes ahead of its class); the gateway that booked it then hears it was kept elsewhere and
removes it. A learnt promise orders only: this gateway sets no room aside for it (the one that booked it does
until it hears), so the fleet's room is never set aside twice. A wait beyond the Retry-After cap is no
promise: the client is told not to retry (``x-should-retry: false``), so no slot is held for it. Why this and
not a longer queue limit: that only moves the race (64-79 % first-retry success at 10 s, against 100 % with
promises at 2 s in ``bench.bench_admission``, 2x overload); and a client's retry-count header alone cannot say
which slot it was given, so it only tells a retry (1 or more) from a first attempt (0), which never claims.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import heapq
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from kvgate.admission.decision import AdmissionRequest, Admit, Decision, Refusal
from kvgate.admission.queue import Ahead, QueuedRequest, WaitQueue

RETRY_COUNT_HEADER = "x-stainless-retry-count"
IDEMPOTENCY_KEY_HEADER = "idempotency-key"

PromiseKey = tuple[str, bytes]
"""(tenant name, the request's own key or the fingerprint of its body): ``promise_key``."""
LEARNT_ID = 0
"""``promise_id`` of a promise another gateway booked (own promises count from 1)."""


@dataclass(frozen=True, slots=True)
class Promise:
    promise_id: int
    key: PromiseKey
    request: AdmissionRequest
    due_s: float

    @property
    def kv_tokens(self) -> int:
        return self.request.cost.kv_tokens

    @property
    def rank(self) -> int:
        return self.request.tenant.priority.rank


FORECAST_ERROR_BUCKETS_S = (-2.0, -1.0, -0.5, -0.25, -0.1, 0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
"""Upper bounds of the promise forecast error histogram (seconds; ``+Inf`` follows)."""


@dataclass(slots=True)
class ForecastErrors:
    """A histogram of (when a promise's room was there) - (the time promised), in seconds: negative,
    the room waited for the client; positive, the client came back before its room."""

    bounds_s: tuple[float, ...] = FORECAST_ERROR_BUCKETS_S
    counts: list[int] = dataclasses.field(default_factory=lambda: [0] * (len(FORECAST_ERROR_BUCKETS_S) + 1))
    """Per bucket, not cumulative; the last is past every bound."""
    sum_s: float = 0.0
    count: int = 0

    def observe(self, error_s: float) -> None:
        self.counts[bisect.bisect_left(self.bounds_s, error_s)] += 1
        if math.isfinite(error_s):
            self.sum_s += error_s
        self.count += 1


@dataclass(slots=True)
class PromiseCounts:
    """What became of the promises booked since start: the figures that say whether a Retry-After
    can be trusted. ``kept``: the refused request came back in its window and was admitted, at once
    or from the queue it joined at the head of its class; ``broken``: it came back in its window and
    was refused all the same, at once or when its place in the queue ran out; ``lapsed``: it did not
    come back in time. ``errors``: how far each promise's time was from its room."""

    made: int = 0
    kept: int = 0
    broken: int = 0
    lapsed: int = 0
    errors: ForecastErrors = dataclasses.field(default_factory=ForecastErrors)

    def claimed(self, promise: Promise, decision: Decision, now_s: float, room_at_s: float | None) -> None:
        """Count what a request that came back to ``promise`` was answered at ``now_s``. A claimant
        queued at the head of its class is counted when it leaves the queue, not here."""
        if isinstance(decision, Refusal):
            self.broken += 1
            late_s = math.inf if decision.retry_after is None else decision.retry_after.expected_s
            self.errors.observe(now_s + late_s - promise.due_s)
        elif isinstance(decision, Admit):
            self.kept += 1
            self.errors.observe((now_s if room_at_s is None else room_at_s) - promise.due_s)


class PromiseBook:
    """Booked promises, ordered by slot time; every operation is at most linear in their number."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.counts = PromiseCounts()
        self._by_id: dict[int, Promise] = {}
        self._by_key: dict[PromiseKey, list[int]] = {}
        self._order: list[tuple[float, int]] = []
        """(due_s, promise_id), sorted: due and expired promises are a prefix."""
        self._sums: dict[tuple[int, str], list[int]] = {}
        """(rank, model) -> [requests, kv, prompt, max output] promised."""
        self._next_id = 1
        self.kv_tokens = 0
        self._learnt: dict[PromiseKey, float] = {}
        """Other gateways' promises: key -> slot time (this gateway's clock)."""
        self._learnt_order: list[tuple[float, PromiseKey]] = []
        self.shared = False
        """Set by the edge when other gateways hear of this book's promises (``take_news``)."""
        self.booked: list[Promise] = []
        """Promises booked here since the edge last took them (``take_news``), to tell the others."""
        self.kept_here: list[PromiseKey] = []
        """Learnt promises claimed here since the edge last took them, to tell whoever booked them."""
        self._room_at_s: dict[int, float] = {}
        """When each open promise first found its room held for it (``held``)."""

    def __len__(self) -> int:
        return len(self._by_id)

    def book(self, key: PromiseKey, request: AdmissionRequest, due_s: float) -> Promise:
        promise = Promise(self._next_id, key, request, due_s)
        self._next_id += 1
        self._by_id[promise.promise_id] = promise
        self._by_key.setdefault(key, []).append(promise.promise_id)
        bisect.insort(self._order, (due_s, promise.promise_id))
        self.kv_tokens += promise.kv_tokens
        self._add_sums(promise, +1)
        self.counts.made += 1
        if self.shared:
            self.booked.append(promise)
        return promise

    def offer(
        self,
        request: AdmissionRequest,
        expected_s: float,
        now_s: float,
        cap_s: float,
        max_kv_tokens: float = math.inf,
    ) -> float | None:
        """Book a refused request a slot when the gateway can stand behind it: it can be recognised
        coming back (``promise_key``), and its room can be held beside the other promises due with
        it within ``max_kv_tokens`` (the promises' share of the fleet) no later than ``cap_s``
        from now (what the client waits). The slot is the first time from ``expected_s`` on at
        which the share holds it (``slot_s``). Its wait from ``now_s``, or None: nothing was booked,
        and the client is to be told not to retry. The promise keeps its tenant and cost, not its
        body."""
        key = promise_key(request)
        if key is None or not math.isfinite(expected_s) or expected_s > cap_s:
            return None
        due_s = self.slot_s(now_s + expected_s, request.cost.kv_tokens, max_kv_tokens)
        if due_s is None or due_s - now_s > cap_s:
            return None
        self.book(key, dataclasses.replace(request, body=None), due_s)
        return due_s - now_s

    def slot_s(self, from_s: float, kv_tokens: int, max_kv_tokens: float) -> float | None:
        """The first slot time from ``from_s`` on at which a promise of ``kv_tokens`` fits in
        ``max_kv_tokens`` beside the promises whose claim windows overlap its own (their room is
        held at the same time, ``due``); None if it never fits."""
        if kv_tokens > max_kv_tokens:
            return None
        span_s = 2.0 * self.grace_s
        # From ``from_s``, or just after an overlapping window closes (``_order`` is sorted).
        later = (d + span_s + 1e-6 for d, _ in self._order if d + span_s >= from_s)
        for at_s in (from_s, *later):
            overlapping = sum(self._by_id[i].kv_tokens for d, i in self._order if abs(d - at_s) <= span_s)
            if overlapping + kv_tokens <= max_kv_tokens:
                return at_s
        return None

    def held(self, promise: Promise, now_s: float) -> None:
        """The fleet has the promise's room set aside for it at ``now_s`` (the first time counts)."""
        if promise.promise_id != LEARNT_ID:
            self._room_at_s.setdefault(promise.promise_id, now_s)

    def room_at_s(self, promise: Promise) -> float | None:
        """When the promise's room was first held for it; None while it has not been."""
        return self._room_at_s.get(promise.promise_id)

    def returning(self, request: AdmissionRequest) -> Promise | None:
        """The promise ``request`` comes back to claim: booked under its key, and the request is a
        retry (its own key says so; without one, a first attempt never claims, even with the same
        body)."""
        if not (self._by_id or self._learnt) or (request.request_key is None and not request.retry_count):
            return None
        key = promise_key(request)
        if key is None:
            return None
        own = self.find(key)
        if own is not None or key not in self._learnt:
            return own
        return Promise(LEARNT_ID, key, request, self._learnt[key])

    def learn(self, key: PromiseKey, due_s: float) -> None:
        """Another gateway booked a promise under ``key`` for a slot at ``due_s``."""
        heapq.heappush(self._learnt_order, (due_s, key))
        self._learnt[key] = due_s

    def take_news(self) -> tuple[list[Promise], list[PromiseKey]]:
        """What the other gateways have not heard yet: promises booked here, learnt ones kept here."""
        booked = [p for p in self.booked if p.promise_id in self._by_id]  # not yet claimed or lapsed
        kept = self.kept_here
        self.booked, self.kept_here = [], []
        return booked, kept

    def find(self, key: PromiseKey) -> Promise | None:
        """The earliest promise booked under ``key``."""
        ids = self._by_key.get(key)
        if not ids:
            return None
        return min((self._by_id[i] for i in ids), key=lambda p: (p.due_s, p.promise_id))

    def remove(self, promise: Promise) -> None:
        if promise.promise_id == LEARNT_ID:
            if self._learnt.pop(promise.key, None) is not None:
                self.kept_here.append(promise.key)
            return
        if self._by_id.pop(promise.promise_id, None) is None:
            return
        ids = self._by_key[promise.key]
        ids.remove(promise.promise_id)
        if not ids:
            del self._by_key[promise.key]
        index = bisect.bisect_left(self._order, (promise.due_s, promise.promise_id))
        del self._order[index]
        self.kv_tokens -= promise.kv_tokens
        self._add_sums(promise, -1)
        self._room_at_s.pop(promise.promise_id, None)

    def expire(self, now_s: float) -> int:
        """Release promises whose claim window closed before ``now_s``; how many."""
        learnt = self._learnt_order
        while learnt and learnt[0][0] + self.grace_s < now_s:
            due_s, key = heapq.heappop(learnt)
            if self._learnt.get(key) == due_s:
                del self._learnt[key]
        released = 0
        while self._order and self._order[0][0] + self.grace_s < now_s:
            promise = self._by_id[self._order[0][1]]
            room_at_s = self._room_at_s.get(promise.promise_id)
            if room_at_s is not None:
                self.counts.errors.observe(room_at_s - promise.due_s)
            self.remove(promise)
            released += 1
        self.counts.lapsed += released
        return released

    def due(self, now_s: float) -> Iterator[Promise]:
        """Promises whose claim window is open or opens by ``now_s``, earliest slot first."""
        for due_s, promise_id in self._order:
            if due_s - self.grace_s > now_s:
                return
            yield self._by_id[promise_id]

    def has_due(self, now_s: float, rank: int) -> bool:
        """Is a promise of the same or a higher priority due by ``now_s``?"""
        for due_s, promise_id in self._order:
            if due_s - self.grace_s > now_s:
                return False
            if self._by_id[promise_id].rank <= rank:
                return True
        return False

    def ahead(self, rank: int, model: str, due_s: float | None = None) -> Ahead:
        """Promised work for ``model`` served before a request of class ``rank``: every promise of
        a higher class and, of its own class, all of them (a newcomer) or those due before
        ``due_s`` (a claimant of a slot due then)."""
        requests = kv = prompt = output = 0
        for (r, m), sums in self._sums.items():
            if m == model and (r < rank or (r == rank and due_s is None)):
                requests += sums[0]
                kv += sums[1]
                prompt += sums[2]
                output += sums[3]
        if due_s is not None:
            for promise in self._by_id.values():
                cost = promise.request.cost
                if promise.rank == rank and cost.model == model and promise.due_s < due_s:
                    requests += 1
                    kv += cost.kv_tokens
                    prompt += cost.prompt_tokens
                    output += cost.max_output_tokens
        return Ahead(requests, kv, prompt, output)

    def _add_sums(self, promise: Promise, sign: int) -> None:
        cost = promise.request.cost
        key = (promise.rank, cost.model)
        sums = self._sums.setdefault(key, [0, 0, 0, 0])
        for i, value in enumerate((1, cost.kv_tokens, cost.prompt_tokens, cost.max_output_tokens)):
            sums[i] += sign * value
        if sums[0] == 0:
            del self._sums[key]


def promise_key(request: AdmissionRequest) -> PromiseKey | None:
    """Whose promise a request is: its tenant and its own key (``Idempotency-Key``), which a client
    sends again with every attempt of one request; without a key, its tenant and body digest, when
    it says how often it tried (otherwise a retry could not be told from a new request with the
    same body). None: it cannot be recognised, so it is promised nothing."""
    if request.request_key is not None:
        return (request.tenant.name, b"key:" + request.request_key.encode())
    if request.body is None or request.retry_count is None:
        return None
    return (request.tenant.name, fingerprint(request.body))


def fingerprint(body: bytes) -> bytes:
    """A digest of the request body as sent: a client's retry sends the same bytes."""
    return hashlib.blake2b(body, digest_size=16).digest()


def request_key(headers: Mapping[str, str]) -> str | None:
    """The client's ``Idempotency-Key``: 1 to 255 visible ASCII characters, else None (ignored)."""
    raw = headers.get(IDEMPOTENCY_KEY_HEADER)
    if raw is None or not 0 < len(raw) <= 255 or not all("!" <= c <= "~" for c in raw):
        return None
    return raw


def retry_count(headers: Mapping[str, str]) -> int | None:
    """Earlier attempts by the client's own count (``x-stainless-retry-count``, sent by the openai
    SDKs on every attempt); None when absent or not a count. ``headers`` has lower-case names."""
    raw = headers.get(RETRY_COUNT_HEADER)
    if raw is None or len(raw) > 9 or not (raw.isascii() and raw.isdigit()):
        return None
    return int(raw)


def work_ahead(queue: WaitQueue, book: PromiseBook, entry: QueuedRequest) -> Ahead:
    """Queued and promised work dispatched before ``entry``: a claimant goes at the head of its
    class, anyone else behind its tenant's share and the promises due before it."""
    request = entry.request
    if entry.promised_due_s is None:
        queued = queue.ahead(request.tenant, entry.rank, request.model)
    else:
        queued = queue.ahead_of_claimant(entry.rank, request.model)
    promised = book.ahead(entry.rank, request.model, entry.promised_due_s)
    return Ahead(
        queued.requests + promised.requests,
        queued.kv_tokens + promised.kv_tokens,
        queued.prompt_tokens + promised.prompt_tokens,
        queued.max_output_tokens + promised.max_output_tokens,
    )
