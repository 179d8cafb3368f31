from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest

from kvgate.config.routing import RoutingConfig
from kvgate.routing.kv_events import BlockStored
from kvgate.routing.request import RoutingRequest
from kvgate.routing.router import Router
from kvgate.vocabulary.replica import ReplicaLoad, ReplicaView, Role

MODEL = "m"
SYSTEM_PROMPT = list(range(160))


def view(replica_id: str, backlog: int = 0, **changes: object) -> ReplicaView:
    """A replica with ``backlog`` prompt tokens routed there and not yet computed."""
    load = ReplicaLoad(
        pending_prompt_tokens=backlog,
        resident_sequences=1 if backlog else 0,
        reserved_kv_tokens=backlog,
        pending_uncached_tokens=backlog,
    )
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
        load=load,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def request(user: int = 0, prompt: list[int] = SYSTEM_PROMPT) -> RoutingRequest:
    return RoutingRequest.from_token_ids(
        MODEL, [*prompt, *range(10_000 + 32 * user, 10_032 + 32 * user)], 100
    )


def router(seed: int = 0, **fields: object) -> Router:
    return Router(RoutingConfig.model_validate(fields), random.Random(seed))


RATE = 10_000.0
"""Prefill tokens per second: with the default tolerance (0.5 s), 5,000 tokens of backlog."""


def test_the_least_prefill_work_wins_without_a_prefix() -> None:
    fleet = [view("a", 5_000), view("b", 1_000), view("c", 3_000)]
    decision = router().choose(RoutingRequest(MODEL, 100, 100), fleet, 0.0, prefill_tokens_per_s=RATE)
    assert (decision.replica_id, decision.reason) == ("b", "least_work")
    scores = {s.replica_id: s for s in decision.scores}
    # backlog + the 100 prompt tokens + the decode work (0.02 per KV token reserved there)
    assert {r: s.work_tokens for r, s in scores.items()} == {"a": 5_200, "b": 1_120, "c": 3_160}
    assert decision.cached_prompt_tokens == 0


def test_the_replica_caching_the_prefix_keeps_it_within_the_ttft_tolerance_then_it_spills() -> None:
    r = router(affinity_min_tokens=64)
    r.prefix_index.record("a", request(0).block_hashes)
    near = [view("a", 4_000), view("b", 0), view("c", 0)]
    kept = r.choose(request(1), near, 0.0, prefill_tokens_per_s=RATE)
    assert (kept.replica_id, kept.reason) == ("a", "prefix_affinity")
    assert kept.cached_prompt_tokens == 160, "the system prompt's ten blocks, not the user's own"
    score = kept.score_of("a")
    assert score is not None and (score.cached_tokens, score.backlog_tokens) == (160, 4_000)
    far = [view("a", 6_000), view("b", 0), view("c", 0)]
    spilled = r.choose(request(2), far, 0.0, prefill_tokens_per_s=RATE)
    assert (spilled.replica_id, spilled.reason) in {("b", "least_work"), ("c", "least_work")}
    fresh = router(affinity_min_tokens=64)
    fresh.prefix_index.record("a", request(0).block_hashes)
    assert fresh.choose(request(3), near, 0.0).reason == "least_work", "without a measured rate, no wait"


def test_a_prefix_every_candidate_holds_decides_nothing() -> None:
    r = router(affinity_min_tokens=64)
    for replica in "abc":
        r.prefix_index.record(replica, request(0).block_hashes[:10])
    fleet = [view("a", 3_000), view("b", 1_000), view("c", 2_000)]
    decision = r.choose(request(1), fleet, 0.0, prefill_tokens_per_s=RATE)
    assert (decision.replica_id, decision.reason) == ("b", "least_work")
    assert decision.cached_prompt_tokens == 160


def test_a_prefix_too_short_to_wait_for_is_weighed_as_work_alone() -> None:
    r = router(affinity_min_tokens=512)
    r.prefix_index.record("a", request(0).block_hashes)
    decision = r.choose(request(1), [view("a", 1_000), view("b", 0)], 0.0, prefill_tokens_per_s=RATE)
    assert (decision.replica_id, decision.reason) == ("b", "least_work"), (
        "160 cached tokens < 1,000 more work"
    )


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
        r = router(seed=seed)
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
    r = router(sample_size=8, affinity_min_tokens=64)
    fleet = [view(f"r{i:03}", 10_000) for i in range(400)]
    r.prefix_index.record("r123", request(0).block_hashes)
    decision = r.choose(request(1), fleet, 0.0, prefill_tokens_per_s=RATE)
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
    r = router(sample_size=4, affinity_min_tokens=64)
    r.prefix_index.record("gone", request(0).block_hashes)
    fleet = [view(f"r{i:03}", 10_000) for i in range(50)]
    holders = set()
    for _ in range(3):
        decision = r.choose(request(1), fleet, 0.0, prefill_tokens_per_s=RATE)
        assert decision.replica_id is not None and decision.replica_id != "gone"
        holders.add(decision.replica_id)
    decision = r.choose(request(2), list(reversed(fleet)), 0.0, prefill_tokens_per_s=RATE)
    assert decision.replica_id in holders
    assert decision.reason == "prefix_affinity"


LONG_PROMPT = list(range(512))
"""As long as ``affinity_min_tokens`` (512): a prefix worth waiting for."""


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


def events_router(**fields: object) -> Router:
    r = router(**fields)
    for replica in "abc":
        r.cache.start(replica)
    return r


def test_replicas_publishing_events_are_read_from_them_and_decide_as_a_right_routed_index_would() -> None:
    approx, events = router(affinity_min_tokens=64), events_router(affinity_min_tokens=64)
    approx.prefix_index.record("a", request(0).block_hashes)
    tokens = [*SYSTEM_PROMPT, *range(10_000, 10_032)]
    events.cache.apply("a", BlockStored(tuple(range(1, 13)), None, tuple(tokens), 16))
    for user in range(1, 6):
        fleet = [view("a", 1_000 * user), view("b"), view("c")]
        one = approx.choose(request(user), fleet, 0.0, prefill_tokens_per_s=RATE)
        other = events.choose(request(user), fleet, 0.0, prefill_tokens_per_s=RATE)
        assert (one.replica_id, one.reason, one.cached_prompt_tokens) == (
            other.replica_id,
            other.reason,
            other.cached_prompt_tokens,
        )
    assert events.cache.match("a", request(0).block_hashes, 0.0).gpu_blocks == 12


def test_a_host_tier_hit_counts_for_the_prefill_it_saves() -> None:
    r = events_router(affinity_min_tokens=64)
    prompt = list(range(4_096))
    r.cache.apply("a", BlockStored(tuple(range(256)), None, tuple(prompt), 16, "CPU"))
    r.cache.apply("b", BlockStored(tuple(range(256)), None, tuple(prompt), 16, "GPU"))
    ask = RoutingRequest(MODEL, 4_096 + 32, 100, request(0, prompt).block_hashes, kv_bytes_per_token=131_072)
    fleet = [view("a"), view("b", 3_000), view("c")]
    decision = r.choose(ask, fleet, 0.0, prefill_tokens_per_s=29_000.0)
    scores = {s.replica_id: s for s in decision.scores}
    saving = 1 - 131_072 / 25e9 * 29_000
    assert scores["a"].cached_tokens == pytest.approx(4_096 * saving)
    assert scores["b"].cached_tokens == 4_096 and scores["c"].cached_tokens == 0
    assert (decision.replica_id, decision.reason) == ("b", "prefix_affinity"), "the GPU copy keeps it"
    assert decision.cached_prompt_tokens == 4_096
