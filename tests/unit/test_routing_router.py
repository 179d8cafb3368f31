from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

from kvgate.config.routing import RoutingConfig
from kvgate.routing.request import RoutingRequest
from kvgate.routing.router import Router
from kvgate.vocabulary.replica import ReplicaLoad, ReplicaView, Role

MODEL = "m"
SYSTEM_PROMPT = list(range(160))


def view(replica_id: str, decode_tokens: int = 0, **changes: object) -> ReplicaView:
    base = ReplicaView(
        replica_id=replica_id,
        url=f"http://{replica_id}",
        pool="default",
        role=Role.MIXED,
        models=frozenset({MODEL}),
        kv_capacity_tokens=100_000,
        max_sequences=64,
        healthy=True,
        ready_since_s=-3_600.0,
        load=ReplicaLoad(remaining_decode_tokens=decode_tokens, reserved_kv_tokens=decode_tokens),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def request(user: int = 0, prompt: list[int] = SYSTEM_PROMPT) -> RoutingRequest:
    return RoutingRequest.from_token_ids(
        MODEL, [*prompt, *range(10_000 + 32 * user, 10_032 + 32 * user)], 100
    )


def router(seed: int = 0, **fields: object) -> Router:
    return Router(RoutingConfig.model_validate(fields), random.Random(seed))


def test_least_outstanding_tokens_wins_without_prefix() -> None:
    fleet = [view("a", 5_000), view("b", 1_000), view("c", 3_000)]
    decision = router().choose(RoutingRequest(MODEL, 100, 100), fleet, 0.0)
    assert (decision.replica_id, decision.reason) == ("b", "least_load")
    assert {s.replica_id for s in decision.scores} == {"a", "b", "c"}
    assert all(0.0 <= part <= 1.0 for s in decision.scores for part in s.parts.values())


def test_prefix_affinity_beats_slightly_lower_load() -> None:
    r = router()
    fleet = [view("a", 2_000), view("b", 2_000), view("c", 2_000)]
    first = r.choose(request(0), fleet, 0.0)
    assert first.replica_id is not None
    lighter = [view(v.replica_id, 2_000 if v.replica_id == first.replica_id else 1_900) for v in fleet]
    second = r.choose(request(1), lighter, 0.0)
    assert (second.replica_id, second.reason) == (first.replica_id, "prefix_affinity")
    score = second.score_of(first.replica_id)
    assert score is not None and score.matched_blocks == 10


def test_bounded_load_drops_affinity_of_a_hot_replica() -> None:
    r = router()
    r.prefix_index.record("a", request(0).block_hashes)
    hot = [view("a", 40_000), view("b", 20_000), view("c", 20_000)]
    decision = r.choose(request(1), hot, 0.0)
    assert decision.replica_id in {"b", "c"}
    hot_score = decision.score_of("a")
    assert hot_score is not None and hot_score.matched_blocks == 10
    assert hot_score.parts["prefix_locality"] == 0.0


def test_exclude_sends_a_retry_elsewhere() -> None:
    fleet = [view("a"), view("b", 9_000)]
    assert router().choose(RoutingRequest(MODEL, 10, 10), fleet, 0.0, exclude={"a"}).replica_id == "b"
    decision = router().choose(RoutingRequest(MODEL, 10, 10), fleet, 0.0, exclude={"a", "b"})
    assert (decision.replica_id, decision.reason) == (None, "excluded")


def test_no_replica_reasons() -> None:
    assert router().choose(RoutingRequest(MODEL, 10, 10), [], 0.0).reason == "no_replica"
    full = [view("a", 99_990)]
    assert router().choose(RoutingRequest(MODEL, 10, 10), full, 0.0).reason == "no_kv_room"
    starting = [view("a", ready_since_s=None)]
    assert router().choose(RoutingRequest(MODEL, 10, 10), starting, 0.0).reason == "not_ready"


def test_ties_are_spread_by_the_seeded_rng_and_reproducible() -> None:
    fleet = [view(name) for name in "abcd"]

    def picks(seed: int) -> list[str | None]:
        r = router(seed=seed, scorer_weights={"outstanding_tokens": 1.0})
        return [r.choose(RoutingRequest(MODEL, 10, 10), fleet, 0.0).replica_id for _ in range(200)]

    assert picks(3) == picks(3)
    assert picks(3) != picks(4)
    assert min(Counter(picks(3)).values()) > 30


def test_round_robin_rotates_over_routable_replicas() -> None:
    r = router(policy="round_robin")
    fleet = [view("a"), view("b", healthy=False), view("c", 90_000), view("d")]
    picks = [r.choose(RoutingRequest(MODEL, 10, 10), fleet, 0.0) for _ in range(4)]
    assert [d.replica_id for d in picks] == ["a", "c", "d", "a"]
    assert {d.reason for d in picks} == {"round_robin"}
    assert r.choose(RoutingRequest(MODEL, 20_000, 10), [fleet[1], fleet[2]], 0.0).reason == "no_kv_room"
    assert r.prefix_index.replica_ids == frozenset()


def test_least_request_counts_sequences_not_tokens() -> None:
    fleet = [
        view("a", load=ReplicaLoad(resident_sequences=1, remaining_decode_tokens=30_000)),
        view("b", load=ReplicaLoad(resident_sequences=3, remaining_decode_tokens=300)),
    ]
    decision = router(policy="least_request").choose(RoutingRequest(MODEL, 10, 10), fleet, 0.0)
    assert (decision.replica_id, decision.reason) == ("a", "least_request")


def test_sampling_large_fleet_still_finds_the_prefix_holder_and_the_index_learns() -> None:
    r = router(sample_size=8)
    fleet = [view(f"r{i:03}", 10_000) for i in range(400)]
    r.prefix_index.record("r123", request(0).block_hashes)
    decision = r.choose(request(1), fleet, 0.0)
    assert (decision.replica_id, decision.reason) == ("r123", "prefix_affinity")
    assert len(decision.scores) <= 9
    assert r.prefix_index.match_blocks("r123", request(1).block_hashes) == request(1).prompt_tokens // 16


def test_sampling_falls_back_to_the_whole_fleet_when_the_sample_is_unroutable() -> None:
    fleet = [view(f"r{i:03}", healthy=False) for i in range(300)]
    fleet[217] = view("r217")
    decision = router(sample_size=4).choose(RoutingRequest(MODEL, 10, 10), fleet, 0.0)
    assert decision.replica_id == "r217"


def test_forget_drops_a_replicas_prefixes() -> None:
    r = router()
    r.choose(request(0), [view("a")], 0.0)
    assert r.prefix_index.size_blocks("a") > 0
    r.forget("a")
    assert r.prefix_index.size_blocks("a") == 0


def test_a_holder_missing_from_the_snapshot_is_skipped_and_reordered_fleets_still_resolve() -> None:
    r = router(sample_size=4)
    r.prefix_index.record("gone", request(0).block_hashes)
    fleet = [view(f"r{i:03}", 10_000) for i in range(50)]
    holders = set()
    for _ in range(3):
        decision = r.choose(request(1), fleet, 0.0)
        assert decision.replica_id is not None and decision.replica_id != "gone"
        holders.add(decision.replica_id)
    decision = r.choose(request(2), list(reversed(fleet)), 0.0)
    assert decision.replica_id in holders
    assert decision.reason == "prefix_affinity"


LONG_PROMPT = list(range(512))
"""Longer than ``prefix_home_key_tokens`` (256): a prefix worth waiting for."""


def test_a_queued_request_waits_for_the_full_replica_holding_its_prefix_within_its_hold() -> None:
    r = router(prefix_hold_s=1.0)
    full = ReplicaLoad(resident_sequences=64, reserved_kv_tokens=10_000)
    fleet = [view("a"), view("b"), view("c")]
    holder = r.choose(request(0, LONG_PROMPT), fleet, 0.0).replica_id
    assert holder is not None
    crowded = [view(v.replica_id, load=full) if v.replica_id == holder else v for v in fleet]
    held = r.choose(request(1, LONG_PROMPT), crowded, 5.0, hold_until_s=5.5)
    assert (held.replica_id, held.reason) == (None, "prefix_holder_full")
    # A holder the caller left out (admission found no room there) counts as full too.
    others = [v for v in fleet if v.replica_id != holder]
    assert r.choose(request(2, LONG_PROMPT), others, 5.0, hold_until_s=6.0).reason == "prefix_holder_full"
    # Once the hold is over it goes where there is room, as without one.
    late = r.choose(request(1, LONG_PROMPT), crowded, 5.5, hold_until_s=5.5)
    assert late.replica_id not in (None, holder)


def test_no_hold_while_a_holder_has_room_or_for_a_short_prefix_or_an_unhealthy_holder() -> None:
    r = router(prefix_hold_s=1.0)
    fleet = [view("a"), view("b"), view("c")]
    holder = r.choose(request(0, LONG_PROMPT), fleet, 0.0).replica_id
    assert r.choose(request(1, LONG_PROMPT), fleet, 5.0, hold_until_s=6.0).replica_id == holder
    sick = [view(v.replica_id, healthy=False) if v.replica_id == holder else v for v in fleet]
    assert r.choose(request(2, LONG_PROMPT), sick, 5.0, hold_until_s=6.0).replica_id not in (None, holder)
    short_holder = r.choose(request(0), fleet, 0.0).replica_id
    full = ReplicaLoad(resident_sequences=64, reserved_kv_tokens=10_000)
    crowded = [view(v.replica_id, load=full) if v.replica_id == short_holder else v for v in fleet]
    assert r.choose(request(1), crowded, 5.0, hold_until_s=6.0).replica_id not in (None, short_holder)


def test_the_hold_lasts_prefix_hold_s_within_half_the_wait_budget_and_never_for_a_promise() -> None:
    r = router(prefix_hold_s=1.0)
    assert r.hold_until_s(10.0) == 11.0
    assert r.hold_until_s(10.0, wait_budget_s=30.0) == 11.0
    assert r.hold_until_s(10.0, wait_budget_s=1.0) == 10.5
    assert r.hold_until_s(10.0, wait_budget_s=30.0, promised=True) == float("-inf")
    assert router(prefix_hold_s=0.0).hold_until_s(10.0) == 10.0
