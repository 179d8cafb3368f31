"""Prompts read once stay on the replica already writing the most, and new prefixes stay off it, so
the other replicas' prefix caches turn over more slowly."""

from __future__ import annotations

from collections import Counter

from kvgate.routing.request import RoutingRequest
from tests.unit.test_routing_homes import REPLICAS, idle_fleet, prompt, router
from tests.unit.test_routing_router import MODEL, view

SCAN = 4_096
"""Scans are off by default; these tests turn them on at the length the docs suggest."""


def document(n: int, tokens: int = 8_000) -> RoutingRequest:
    """A long prompt no other request shares, not even its first block."""
    start = 900_000_000 + 100_000 * n
    return RoutingRequest.from_token_ids(MODEL, list(range(start, start + tokens)), 200)


def test_documents_read_once_follow_the_replica_already_writing_the_most() -> None:
    r = router(scan_prompt_tokens=SCAN)
    placed = [r.choose(document(n), idle_fleet(), float(n)).replica_id for n in range(12)]
    assert len(set(placed)) == 1
    decision = r.choose(document(12), idle_fleet(), 12.0)
    score = decision.score_of(placed[0])
    assert score is not None and score.parts["prefix_locality"] == 1.0


def test_without_scans_documents_go_to_their_own_homes() -> None:
    r = router(scan_prompt_tokens=0)
    placed = Counter(r.choose(document(n), idle_fleet(), float(n)).replica_id for n in range(12))
    assert len(placed) > 1


def test_a_prompt_shorter_than_a_scan_is_not_one() -> None:
    r = router(scan_prompt_tokens=10_000)
    placed = Counter(r.choose(document(n), idle_fleet(), float(n)).replica_id for n in range(12))
    assert len(placed) > 1


def test_new_prefixes_get_no_home_on_the_busiest_writer_but_held_ones_stay() -> None:
    r = router(scan_prompt_tokens=SCAN)
    writer = r.choose(document(0), idle_fleet(), 0.0).replica_id
    for n in range(1, 4):
        assert r.choose(document(n), idle_fleet(), float(n)).replica_id == writer
    fresh = router(scan_prompt_tokens=SCAN)
    held = [p for p in range(64) if fresh.choose(prompt(p, 0), idle_fleet(), 0.0).replica_id == writer]
    homes = Counter(r.choose(prompt(p, 0), idle_fleet(), 4.0).replica_id for p in range(64))
    assert writer not in homes and set(homes) == set(REPLICAS) - {writer}

    # A prefix the writer already caches keeps its affinity there.
    keeper = router(scan_prompt_tokens=SCAN)
    for p in held[:4]:
        assert keeper.choose(prompt(p, 0), idle_fleet(), 0.0).replica_id == writer
    for n in range(4):
        keeper.choose(document(n), idle_fleet(), 1.0 + n)
    assert {keeper.choose(prompt(p, 1), idle_fleet(), 5.0).replica_id for p in held[:4]} == {writer}


def test_a_writer_over_the_load_limit_passes_documents_on() -> None:
    r = router(scan_prompt_tokens=SCAN)
    writer = r.choose(document(0), idle_fleet(), 0.0).replica_id
    busy = [view(i, 60_000 if i == writer else 0) for i in REPLICAS]
    assert r.choose(document(1), busy, 1.0).replica_id != writer


def test_a_forgotten_writer_is_no_longer_avoided() -> None:
    r = router(scan_prompt_tokens=SCAN)
    writer = r.choose(document(0), idle_fleet(), 0.0).replica_id
    assert writer is not None
    r.forget(writer)
    fresh = router(scan_prompt_tokens=SCAN)
    for p in range(16):
        assert (
            r.choose(prompt(p, 0), idle_fleet(), 1.0).replica_id
            == fresh.choose(prompt(p, 0), idle_fleet(), 1.0).replica_id
        )
