from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.admission.retry_after import (
    Backlog,
    FleetDrain,
    ReplicaDrain,
    ResidentWork,
    ServiceRates,
    completions_s,
    drain_wait_s,
    retry_after,
)

RATES = ServiceRates(inter_token_s=0.1, prefill_tokens_per_s=1000.0)


def replica(capacity: int, *resident: ResidentWork, max_active: int = 100, rid: str = "r") -> ReplicaDrain:
    reserved = sum(w.kv_tokens for w in resident)
    completions = completions_s(resident, RATES)
    return ReplicaDrain(rid, capacity - reserved, capacity, len(resident), max_active, completions)


@pytest.mark.parametrize(
    ("expected_s", "seconds", "milliseconds", "honest"),
    [
        (0.2, 1, 200, True),
        (1.0, 1, 1000, True),
        (2.0001, 3, 2001, True),
        (0.0, 1, 1, True),
        (59.9991, 60, 60000, True),
        (60.0, 60, 60000, True),
        (500.0, 60, 60000, False),
        (math.inf, 60, 60000, False),
    ],
)
def test_headers_round_up_and_cap(expected_s: float, seconds: int, milliseconds: int, honest: bool) -> None:
    hint = retry_after(expected_s, cap_s=60.0)
    assert (hint.seconds, hint.milliseconds, hint.honest) == (seconds, milliseconds, honest)
    said = {"retry-after": str(seconds), "retry-after-ms": str(milliseconds)}
    assert hint.headers() == (said if honest else {**said, "x-should-retry": "false"})
    assert hint.expected_s == expected_s


def test_completions_queue_prefill_in_reservation_order() -> None:
    resident = [
        ResidentWork(kv_tokens=600, pending_prompt_tokens=0, expected_decode_tokens=30),
        ResidentWork(kv_tokens=400, pending_prompt_tokens=500, expected_decode_tokens=10),
        ResidentWork(kv_tokens=300, pending_prompt_tokens=500, expected_decode_tokens=10),
    ]
    assert completions_s(resident, RATES) == ((1.5, 400), (2.0, 300), (3.0, 600))


def test_wait_is_the_first_completion_that_frees_enough() -> None:
    r = replica(
        1000,
        ResidentWork(kv_tokens=600, pending_prompt_tokens=0, expected_decode_tokens=10),
        ResidentWork(kv_tokens=400, pending_prompt_tokens=0, expected_decode_tokens=20),
    )
    assert drain_wait_s(0, FleetDrain.of([r]), Backlog(), RATES) == 0.0
    assert drain_wait_s(500, FleetDrain.of([r]), Backlog(), RATES) == pytest.approx(1.0)
    assert drain_wait_s(900, FleetDrain.of([r]), Backlog(), RATES) == pytest.approx(2.0)
    assert drain_wait_s(1001, FleetDrain.of([r]), Backlog(), RATES) == math.inf


def test_work_queued_ahead_is_served_first() -> None:
    r = replica(1000, ResidentWork(kv_tokens=1000, pending_prompt_tokens=0, expected_decode_tokens=10))
    alone = drain_wait_s(500, FleetDrain.of([r]), Backlog(), RATES)
    behind = drain_wait_s(
        500,
        FleetDrain.of([r]),
        Backlog(requests=1, kv_tokens=500, prompt_tokens=250, expected_output_tokens=50),
        RATES,
    )
    waves = drain_wait_s(
        500,
        FleetDrain.of([r]),
        Backlog(requests=3, kv_tokens=1500, prompt_tokens=750, expected_output_tokens=150),
        RATES,
    )
    assert alone == pytest.approx(1.0)
    assert behind == pytest.approx(1.0)  # both fit once the resident sequence finishes
    assert waves == pytest.approx(1.0 + 750 / 1000 + 150 * 0.1 / 2)


def test_sequence_slots_count_too() -> None:
    r = replica(
        10**6,
        ResidentWork(kv_tokens=1, pending_prompt_tokens=0, expected_decode_tokens=10),
        ResidentWork(kv_tokens=1, pending_prompt_tokens=0, expected_decode_tokens=30),
        max_active=2,
    )
    assert drain_wait_s(1, FleetDrain.of([r]), Backlog(), RATES) == pytest.approx(1.0)
    assert drain_wait_s(1, FleetDrain.of([r]), Backlog(requests=1, kv_tokens=1), RATES) == pytest.approx(3.0)


def test_the_best_replica_decides() -> None:
    busy = replica(1000, ResidentWork(1000, 0, 100), rid="busy")
    soon = replica(1000, ResidentWork(1000, 0, 5), rid="soon")
    assert drain_wait_s(800, FleetDrain.of([busy, soon]), Backlog(), RATES) == pytest.approx(0.5)


works = st.lists(
    st.builds(
        ResidentWork,
        kv_tokens=st.integers(1, 4000),
        pending_prompt_tokens=st.integers(0, 2000),
        expected_decode_tokens=st.floats(0, 2000),
    ),
    max_size=12,
)
backlogs = st.builds(
    Backlog,
    requests=st.integers(0, 50),
    kv_tokens=st.integers(0, 100_000),
    prompt_tokens=st.integers(0, 50_000),
    expected_output_tokens=st.floats(0, 50_000),
)


@settings(max_examples=300, deadline=None)
@given(
    resident=works,
    capacity_slack=st.integers(0, 20_000),
    kv_tokens=st.integers(1, 8000),
    backlog=backlogs,
    extra=backlogs,
    max_active=st.integers(1, 16),
)
def test_wait_is_monotone_in_backlog(
    resident: list[ResidentWork],
    capacity_slack: int,
    kv_tokens: int,
    backlog: Backlog,
    extra: Backlog,
    max_active: int,
) -> None:
    capacity = sum(w.kv_tokens for w in resident) + capacity_slack + kv_tokens
    r = replica(capacity, *resident, max_active=max(max_active, len(resident)))
    more = Backlog(
        backlog.requests + extra.requests,
        backlog.kv_tokens + extra.kv_tokens,
        backlog.prompt_tokens + extra.prompt_tokens,
        backlog.expected_output_tokens + extra.expected_output_tokens,
    )
    assert drain_wait_s(kv_tokens, FleetDrain.of([r]), backlog, RATES) <= drain_wait_s(
        kv_tokens, FleetDrain.of([r]), more, RATES
    )


@settings(max_examples=300, deadline=None)
@given(resident=works, added=works, kv_tokens=st.integers(1, 8000), backlog=backlogs)
def test_wait_is_monotone_in_resident_work(
    resident: list[ResidentWork], added: list[ResidentWork], kv_tokens: int, backlog: Backlog
) -> None:
    capacity = sum(w.kv_tokens for w in resident + added) + kv_tokens
    fewer = replica(capacity, *resident, max_active=64)
    more = replica(capacity, *resident, *added, max_active=64)
    assert drain_wait_s(kv_tokens, FleetDrain.of([fewer]), backlog, RATES) <= drain_wait_s(
        kv_tokens, FleetDrain.of([more]), backlog, RATES
    )


def reference_wait_s(kv_tokens: int, replicas: list[ReplicaDrain], backlog: Backlog) -> float | None:
    """Replay completions one by one; None when the backlog never fits (the waves case)."""
    room = {r.replica_id: r.kv_room_tokens for r in replicas}
    active = {r.replica_id: r.active_sequences for r in replicas}
    limit = {r.replica_id: r.max_active_sequences for r in replicas}

    def ok() -> bool:
        slots = sum(max(0, limit[i] - active[i]) for i in room)
        if sum(room.values()) < kv_tokens + backlog.kv_tokens or slots < 1 + backlog.requests:
            return False
        return any(room[i] >= kv_tokens and active[i] < limit[i] for i in room)

    if ok():
        return 0.0
    events = sorted((t, freed, r.replica_id) for r in replicas for t, freed in r.completions)
    for t, freed, rid in events:
        room[rid] += freed
        active[rid] -= 1
        if ok():
            return t
    return None


@settings(max_examples=300, deadline=None)
@given(
    fleet=st.lists(st.tuples(works, st.integers(0, 5000), st.integers(1, 8)), min_size=1, max_size=4),
    kv_tokens=st.integers(1, 6000),
    backlog=backlogs,
)
def test_fast_estimate_matches_a_replay(
    fleet: list[tuple[list[ResidentWork], int, int]], kv_tokens: int, backlog: Backlog
) -> None:
    replicas = [
        replica(sum(w.kv_tokens for w in resident) + slack, *resident, max_active=max_active, rid=f"r{i}")
        for i, (resident, slack, max_active) in enumerate(fleet)
    ]
    expected = reference_wait_s(kv_tokens, replicas, backlog)
    got = drain_wait_s(kv_tokens, FleetDrain.of(replicas), backlog, RATES)
    if any(r.kv_capacity_tokens >= kv_tokens for r in replicas):
        if expected is None:
            last = max((t for r in replicas for t, _ in r.completions), default=0.0)
            assert got >= last
        else:
            assert got == expected
    else:
        assert got == float("inf")
