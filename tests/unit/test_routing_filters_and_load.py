from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvgate.config.routing import RoutingConfig
from kvgate.routing.filters import Gate
from kvgate.routing.load import load_ratios
from kvgate.routing.request import RoutingRequest
from kvgate.routing.router import Router
from kvgate.vocabulary.replica import ReplicaLoad, ReplicaView, Role, ScrapedMetrics

MODEL = "m"
REQUEST = RoutingRequest(MODEL, prompt_tokens=1_000, max_output_tokens=1_000)


def view(replica_id: str = "a", **changes: object) -> ReplicaView:
    base = ReplicaView(
        replica_id=replica_id,
        url=f"http://{replica_id}",
        pool="default",
        role=Role.MIXED,
        models=frozenset({MODEL}),
        kv_capacity_tokens=10_000,
        max_sequences=4,
        healthy=True,
        ready_since_s=0.0,
        load=ReplicaLoad(),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({}, None),
        ({"models": frozenset({"other"})}, "no_model"),
        ({"healthy": False}, "unhealthy"),
        ({"ready_since_s": None}, "not_ready"),
        ({"ready_since_s": 11.0}, "not_ready"),
        ({"backoff_until_s": 10.5}, "backoff"),
        ({"backoff_until_s": 10.0}, None),
        ({"load": ReplicaLoad(reserved_kv_tokens=8_001, resident_sequences=1)}, "no_kv_room"),
        ({"load": ReplicaLoad(reserved_kv_tokens=8_000, resident_sequences=1)}, None),
        ({"load": ReplicaLoad(resident_sequences=4)}, "no_kv_room"),
    ],
)
def test_each_filter(changes: dict[str, Any], reason: str | None) -> None:
    assert Gate(REQUEST, now_s=10.0).rejection(view(**changes)) == reason


def test_excluded_replica_is_rejected_first() -> None:
    assert Gate(REQUEST, 10.0, exclude={"a"}).rejection(view(healthy=False)) == "excluded"


def test_empty_result_names_the_binding_filter() -> None:
    gate = Gate(REQUEST, now_s=10.0)
    full = ReplicaLoad(reserved_kv_tokens=9_500, resident_sequences=1)
    assert gate.passing([view("a", healthy=False), view("b", load=full)]) == ([], "no_kv_room")
    assert gate.passing([view("a", healthy=False), view("b", ready_since_s=None)]) == ([], "not_ready")
    assert gate.passing([]) == ([], "no_replica")
    passed, reason = gate.passing([view("a", healthy=False), view("b")])
    assert [v.replica_id for v in passed] == ["b"] and reason == ""


def test_admissions_sequence_guard_is_the_slot_limit_of_the_filter_and_the_slot_share() -> None:
    """A replica with 4 slots of its own but a guard of 2 (an ITL objective's learned limit) is
    full at 2 sequences for routing as for admission, and its slot share counts against the 2."""
    two = ReplicaLoad(resident_sequences=2)
    guarded = Gate(REQUEST, 10.0, slots=lambda v: 2)
    assert Gate(REQUEST, 10.0).rejection(view(load=two)) is None
    assert guarded.rejection(view(load=two)) == "no_kv_room"
    one = ReplicaLoad(resident_sequences=1)
    assert load_ratios([view(load=one)], 10.0, 5.0)[1] == [0.25]
    assert load_ratios([view(load=one)], 10.0, 5.0, guarded.slots)[1] == [0.5]


def test_without_the_room_check_a_full_replica_passes_and_keeps_its_real_load() -> None:
    """Admission off: nothing is held back for room, yet a fuller replica still scores as fuller."""
    full = ReplicaLoad(pending_prompt_tokens=9_000, resident_sequences=4, reserved_kv_tokens=12_000)
    fuller = ReplicaLoad(pending_prompt_tokens=20_000, resident_sequences=6, reserved_kv_tokens=30_000)
    gate = Gate(REQUEST, 10.0, check_room=False)
    assert gate.rejection(view(load=full)) is None
    assert Gate(REQUEST, 10.0).rejection(view(load=full)) == "no_kv_room"
    passed, _ = gate.passing([view("a", load=full), view("b", load=fuller), view("c", healthy=False)])
    assert [v.replica_id for v in passed] == ["a", "b"]
    assert load_ratios(passed, 10.0, 5.0) == ([0.9, 2.0], [1.0, 1.5])


def test_router_without_the_room_check_sends_to_the_less_loaded_of_two_full_replicas() -> None:
    full = ReplicaLoad(pending_prompt_tokens=9_000, resident_sequences=4, reserved_kv_tokens=12_000)
    fuller = ReplicaLoad(pending_prompt_tokens=20_000, resident_sequences=6, reserved_kv_tokens=30_000)
    router = Router(RoutingConfig(warmup_s=0), random.Random(0))
    fleet = [view("a", load=fuller), view("b", load=full)]
    assert router.choose(REQUEST, fleet, 10.0).reason == "no_kv_room"
    for _ in range(5):
        assert router.choose(REQUEST, fleet, 10.0, check_room=False).replica_id == "b"


times = st.one_of(st.none(), st.floats(0.0, 20.0))
views = st.builds(
    view,
    st.sampled_from(["a", "b", "c"]),
    models=st.sampled_from([frozenset({MODEL}), frozenset({"other"})]),
    healthy=st.booleans(),
    ready_since_s=times,
    backoff_until_s=st.floats(0.0, 20.0),
    max_sequences=st.integers(0, 4),
    load=st.builds(
        ReplicaLoad, resident_sequences=st.integers(0, 4), reserved_kv_tokens=st.integers(0, 10_000)
    ),
)


@given(st.lists(views, max_size=6), st.frozensets(st.sampled_from(["a", "b"])))
def test_admit_passes_exactly_the_views_rejection_lets_through(
    candidates: list[ReplicaView], exclude: frozenset[str]
) -> None:
    gate = Gate(REQUEST, 10.0, exclude)
    passed, reason = gate.passing(candidates)
    assert passed == [v for v in candidates if gate.rejection(v) is None]
    assert (reason == "") == bool(passed)


def scraped(usage: float, running: int, waiting: int, at_s: float) -> ScrapedMetrics:
    return ScrapedMetrics(usage, running, waiting, None, None, at_s)


def test_load_is_outstanding_tokens_over_capacity_and_sequences_over_slots() -> None:
    loaded = view(
        load=ReplicaLoad(pending_prompt_tokens=1_000, remaining_decode_tokens=1_500, resident_sequences=1)
    )
    assert load_ratios([loaded], now_s=0.0, stale_s=5.0) == ([0.25], [0.25])


def test_fresh_scrapes_correct_the_slot_share_upward_and_never_the_token_share() -> None:
    """Requests kvgate did not send take slots; KV in use is not work still to come."""
    busy_elsewhere = view("a", scraped=scraped(0.5, 2, 2, at_s=9.0))
    quiet = view(
        "b",
        load=ReplicaLoad(remaining_decode_tokens=5_000, resident_sequences=2),
        scraped=scraped(0.9, 1, 0, at_s=9.0),
    )
    assert load_ratios([busy_elsewhere, quiet], now_s=10.0, stale_s=5.0) == ([0.0, 0.5], [1.0, 0.5])


def test_a_scrape_without_a_queue_does_not_keep_a_just_emptied_replica_full() -> None:
    """Up to an interval old, it may show running requests that have finished since."""
    emptied = view("a", scraped=scraped(0.9, 4, 0, at_s=9.0))
    queued_elsewhere = view("b", scraped=scraped(0.9, 4, 1, at_s=9.0))
    assert load_ratios([emptied, queued_elsewhere], now_s=10.0, stale_s=5.0)[1] == [0.0, 1.25]


def test_one_stale_scrape_puts_every_candidate_on_own_accounting() -> None:
    fresh = view("a", scraped=scraped(0.9, 3, 1, at_s=9.0))
    stale = view(
        "b",
        load=ReplicaLoad(remaining_decode_tokens=2_000, resident_sequences=1),
        scraped=scraped(0.0, 0, 0, at_s=1.0),
    )
    missing = view("c", load=ReplicaLoad(remaining_decode_tokens=1_000))
    assert load_ratios([fresh, stale], now_s=10.0, stale_s=5.0) == ([0.0, 0.2], [0.0, 0.25])
    assert load_ratios([fresh, missing], now_s=10.0, stale_s=5.0) == ([0.0, 0.1], [0.0, 0.0])
