from __future__ import annotations

from collections.abc import Callable
from itertools import count

import pytest

from kvgate.admission.cost import CostEstimate
from kvgate.admission.decision import AdmissionRequest
from kvgate.admission.queue import Ahead, QueuedRequest, WaitQueue
from kvgate.admission.tenants import Tenant
from kvgate.config.tenants import PriorityClass
from kvgate.vocabulary.replica import ReplicaLoad, ReplicaView, Role

SLOT = (
    ReplicaView(
        "r0", "http://r0", "pool", Role.MIXED, frozenset({"m"}), 10**9, 10**6, True, 0.0, ReplicaLoad()
    ),
)
_tickets = count(1)


def entry(tenant: Tenant, kv_tokens: int, at_s: float = 0.0, expires_at_s: float = 1e9) -> QueuedRequest:
    ticket = next(_tickets)
    cost = CostEstimate("m", kv_tokens // 2, kv_tokens - kv_tokens // 2, 1)
    return QueuedRequest(ticket, AdmissionRequest(f"q{ticket}", tenant, cost), at_s, expires_at_s)


def room(tokens: int) -> Callable[[QueuedRequest], tuple[ReplicaView, ...] | None]:
    """A fleet with ``tokens`` of free KV: places entries while they fit."""
    left = [tokens]

    def place(e: QueuedRequest) -> tuple[ReplicaView, ...] | None:
        if e.kv_tokens <= left[0]:
            left[0] -= e.kv_tokens
            return SLOT
        return ()

    return place


def dispatch(
    queue: WaitQueue, now_s: float, place: Callable[[QueuedRequest], tuple[ReplicaView, ...] | None]
) -> list[QueuedRequest]:
    placed = [e for e, _ in queue.walk(now_s, place).placed]
    for e in placed:
        queue.remove(e.ticket)
        queue.charge(e.request.tenant.name, e.request.tenant.weight, e.kv_tokens)
    return placed


@pytest.mark.parametrize(
    ("weights", "sizes"),
    [
        ((1.0, 1.0), (3000, 50)),  # long prompts vs short chats, equal weights
        ((1.0, 3.0), (1000, 1000)),
        ((3.0, 1.0), (50, 2000)),
    ],
)
def test_token_shares_converge_to_weights(weights: tuple[float, float], sizes: tuple[int, int]) -> None:
    room_tokens = 4000
    tenants = [Tenant("a", weights[0]), Tenant("b", weights[1])]
    queue = WaitQueue(10**6, 10**12, hold_after_s=1e9)
    backlog = {"a": 0, "b": 0}
    served = {"a": 0, "b": 0}
    for step in range(600):
        for tenant, size in zip(tenants, sizes, strict=True):
            while backlog[tenant.name] < 2 * room_tokens:
                queue.push(entry(tenant, size, at_s=float(step)))
                backlog[tenant.name] += size
        for e in dispatch(queue, float(step), room(room_tokens)):
            served[e.request.tenant.name] += e.kv_tokens
            backlog[e.request.tenant.name] -= e.kv_tokens
    share_b = served["b"] / (served["a"] + served["b"])
    assert share_b == pytest.approx(weights[1] / sum(weights), abs=0.03)


def test_idle_tenant_banks_no_credit() -> None:
    a, b = Tenant("a"), Tenant("b")
    queue = WaitQueue(100, 10**9, hold_after_s=1e9)
    for _ in range(10):
        queue.push(entry(a, 100))
        dispatch(queue, 0.0, room(100))
    late = [entry(b, 100) for _ in range(5)]
    for e in late:
        queue.push(e)
    queue.push(entry(a, 100))
    order = [e.request.tenant.name for e in dispatch(queue, 0.0, room(300))]
    # b arrived after a was served 1000 tokens but is only lifted to a's level: it alternates, not monopolises
    assert order.count("a") == 1


def test_priority_classes_are_strict() -> None:
    queue = WaitQueue(100, 10**9, hold_after_s=1e9)
    low = entry(Tenant("batch", priority=PriorityClass.SHEDDABLE), 10, at_s=0.0)
    std = entry(Tenant("web"), 10, at_s=1.0)
    crit = entry(Tenant("pager", priority=PriorityClass.CRITICAL), 10, at_s=2.0)
    for e in (low, std, crit):
        queue.push(e)
    assert [e.ticket for e in dispatch(queue, 3.0, room(20))] == [crit.ticket, std.ticket]


def test_small_requests_bypass_a_young_head_that_does_not_fit() -> None:
    queue = WaitQueue(100, 10**9, hold_after_s=5.0)
    big = entry(Tenant("a"), 5000, at_s=0.0)
    small = entry(Tenant("a"), 10, at_s=0.1)
    queue.push(big)
    queue.push(small)
    walk = queue.walk(1.0, room(100))
    assert [e.ticket for e, _ in walk.placed] == [small.ticket]
    assert walk.holding is None


def test_an_aged_head_holds_capacity_until_it_fits() -> None:
    queue = WaitQueue(100, 10**9, hold_after_s=5.0)
    big = entry(Tenant("a"), 5000, at_s=0.0)
    queue.push(big)
    queue.push(entry(Tenant("b"), 10, at_s=0.1))
    walk = queue.walk(5.0, room(4999))
    assert walk.placed == [] and walk.holding == big
    assert [e.ticket for e in dispatch(queue, 6.0, room(5005))] == [big.ticket]
    assert len(queue) == 1


def test_work_ahead_follows_priority_and_fairness() -> None:
    queue = WaitQueue(100, 10**9, hold_after_s=1e9)
    heavy, light = Tenant("heavy"), Tenant("light")
    for _ in range(10):
        queue.push(entry(heavy, 1000))
    queue.push(entry(Tenant("pager", priority=PriorityClass.CRITICAL), 300))
    queue.push(entry(Tenant("batch", priority=PriorityClass.SHEDDABLE), 5000))
    queue.charge("heavy", 1.0, 2000)
    queue.charge("light", 1.0, 500)
    # light starts 1500 tokens behind heavy: heavy's backlog is not ahead of it, the critical work is
    assert queue.ahead(light, PriorityClass.STANDARD.rank, "m") == Ahead(1, 300, 150, 150)
    queue.charge("light", 1.0, 3500)  # now 2000 tokens past heavy: two of heavy's requests go first
    assert queue.ahead(light, PriorityClass.STANDARD.rank, "m") == Ahead(3, 2300, 1150, 1150)
    assert queue.ahead(heavy, PriorityClass.STANDARD.rank, "m").kv_tokens == 10_300
    assert queue.ahead(light, PriorityClass.STANDARD.rank, "other-model") == Ahead()


def test_walk_stops_at_the_requested_ticket() -> None:
    queue = WaitQueue(100, 10**9, hold_after_s=1e9)
    first, second, third = (entry(Tenant("a"), 10, at_s=float(i)) for i in range(3))
    for e in (first, second, third):
        queue.push(e)
    walk = queue.walk(10.0, room(100), stop_at=second.ticket)
    assert [e.ticket for e, _ in walk.placed] == [first.ticket, second.ticket]


def test_cancel_removes_at_once_and_is_idempotent() -> None:
    queue = WaitQueue(2, 1000, hold_after_s=1.0)
    e = entry(Tenant("a"), 600)
    queue.push(e)
    assert not queue.has_room(600)
    assert queue.remove(e.ticket) == e
    assert queue.remove(e.ticket) is None
    assert queue.stats(0.0).requests == 0 and queue.stats(0.0).kv_tokens == 0
    assert queue.has_room(1000)


def test_bounds_in_requests_and_tokens() -> None:
    queue = WaitQueue(2, 1000, hold_after_s=1.0)
    queue.push(entry(Tenant("a"), 10))
    assert queue.has_room(990) and not queue.has_room(991)
    queue.push(entry(Tenant("a"), 10))
    assert not queue.has_room(1)


def test_deadlines_expire_in_order_and_skip_removed() -> None:
    queue = WaitQueue(10, 10**6, hold_after_s=1.0)
    soon = entry(Tenant("a"), 1, expires_at_s=5.0)
    gone = entry(Tenant("a"), 1, expires_at_s=4.0)
    later = entry(Tenant("b"), 1, expires_at_s=9.0)
    for e in (soon, gone, later):
        queue.push(e)
    queue.remove(gone.ticket)
    assert queue.expire(4.9) == []
    assert queue.expire(5.0) == [soon]
    assert [e.ticket for e in queue.entries()] == [later.ticket]
    assert queue.expire(100.0) == [later]
