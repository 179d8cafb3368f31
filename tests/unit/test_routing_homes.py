"""A prefix's home: distinct prefixes partition across replicas, the same in every router, a hot one
spills in its own order, and the pull is worth the prefill tokens a hit saves."""

from __future__ import annotations

import random
from collections import Counter

from kvgate.config.routing import RoutingConfig
from kvgate.routing.rendezvous import HomeRanking
from kvgate.routing.request import RoutingRequest
from kvgate.routing.router import Router
from kvgate.vocabulary.replica import ReplicaView
from tests.unit.test_routing_router import MODEL, view

REPLICAS = ("a", "b", "c", "d")


def prompt(prefix: int, user: int, prefix_tokens: int = 320) -> RoutingRequest:
    system = range(1_000_000 * (prefix + 1), 1_000_000 * (prefix + 1) + prefix_tokens)
    return RoutingRequest.from_token_ids(MODEL, [*system, *range(100 * user, 100 * user + 64)], 100)


def router(seed: int = 0, **fields: object) -> Router:
    return Router(RoutingConfig.model_validate({"seed": seed, **fields}), random.Random(seed))


def idle_fleet() -> list[ReplicaView]:
    return [view(replica_id) for replica_id in REPLICAS]


def home_of(prefix: int, loads: dict[str, int] | None = None, seed: int = 0) -> str | None:
    """Where a fresh router (one that never saw the prefix) sends it."""
    fleet = [view(replica_id, (loads or {}).get(replica_id, 0)) for replica_id in REPLICAS]
    return router(seed).choose(prompt(prefix, 0), fleet, 0.0).replica_id


def test_distinct_prefixes_partition_evenly_and_each_always_goes_home() -> None:
    fleet = idle_fleet()
    routers = [router(seed) for seed in (0, 1, 2)]
    placed: dict[int, set[str | None]] = {p: set() for p in range(64)}
    for user in range(4):
        for p in range(64):
            for r in routers:
                placed[p].add(r.choose(prompt(p, user), fleet, 0.0).replica_id)
    assert all(len(replicas) == 1 for replicas in placed.values())
    per_replica = Counter(next(iter(replicas)) for replicas in placed.values())
    assert set(per_replica) == set(REPLICAS)
    assert min(per_replica.values()) >= 8 and max(per_replica.values()) <= 24


def test_without_homes_unseen_prefixes_follow_the_tie_break_instead() -> None:
    fleet = idle_fleet()
    first = [router(seed, prefix_home_key_tokens=0) for seed in (0, 1)]
    disagreements = sum(
        first[0].choose(prompt(p, 0), fleet, 0.0).replica_id
        != first[1].choose(prompt(p, 0), fleet, 0.0).replica_id
        for p in range(64)
    )
    assert disagreements > 16


def test_a_hot_home_spills_in_the_prefix_order_not_to_the_least_loaded() -> None:
    for prefix in range(8):
        first = home_of(prefix)
        assert first is not None
        hot = {first: 40_000}
        second = home_of(prefix, hot)
        assert second not in (None, first)
        # The spill target is the same whatever the seed, and stays while it is within the bound,
        # even when it is busier than the other candidates.
        busier = {**hot, second: 10_000}
        assert {home_of(prefix, busier, seed) for seed in range(4)} == {second}
        third = home_of(prefix, {**hot, second: 40_000})
        assert third not in (None, first, second)


def test_a_seen_prefix_stays_on_its_spill_replica_while_home_is_hot() -> None:
    r = router()
    first = r.choose(prompt(5, 0), idle_fleet(), 0.0).replica_id
    hot = [view(replica_id, 40_000 if replica_id == first else 5_000) for replica_id in REPLICAS]
    spilled = {r.choose(prompt(5, user), hot, 0.0).replica_id for user in range(1, 6)}
    assert spilled == {home_of(5, {first or "": 40_000})}


def test_the_pull_of_a_home_is_worth_the_prefill_tokens_a_hit_saves() -> None:
    long_prefix = 2_560
    r = router()
    first = r.choose(prompt(7, 0, long_prefix), idle_fleet(), 0.0).replica_id
    assert first is not None
    second = home_of(7, {first: 40_000})
    assert second is not None
    # Second home 15 % of its KV busier than the idlest candidates, first home over the holders' bound.
    loads = {replica_id: 10_000 for replica_id in REPLICAS} | {first: 60_000, second: 25_000}
    fleet = [view(replica_id, loads[replica_id]) for replica_id in REPLICAS]
    known_long = r.choose(prompt(7, 1, long_prefix), fleet, 0.0)
    assert (known_long.replica_id, known_long.reason) == (second, "prefix_affinity")
    score = known_long.score_of(second)
    assert score is not None and score.parts["prefix_locality"] == 1.0

    # An unseen prompt is worth only its key (256 tokens), not enough for 15 % of load.
    unseen = router().choose(prompt(7, 1, long_prefix), fleet, 0.0)
    assert unseen.replica_id not in (first, second)


def test_the_replica_caching_a_prefix_keeps_it_up_to_the_holders_bound() -> None:
    """A holder loses its affinity only past ``holder_load_factor`` (2), a replica that would merely
    be the prefix's home already past ``bounded_load_factor`` (1.25): passing over the holder
    prefills the prefix again elsewhere and caches it twice."""
    long_prefix = 2_560
    for prefix in range(4):
        r, tight = router(), router(holder_load_factor=1.25)
        holder = r.choose(prompt(prefix, 0, long_prefix), idle_fleet(), 0.0).replica_id
        assert (
            holder is not None
            and tight.choose(prompt(prefix, 0, long_prefix), idle_fleet(), 0.0).replica_id == holder
        )

        def fleet(holder_tokens: int, holder: str = holder) -> list[ReplicaView]:
            return [view(i, holder_tokens if i == holder else 10_000) for i in REPLICAS]

        # 30,000 tokens against 10,000 on the others: about 1.9x the mean counting the request.
        kept = r.choose(prompt(prefix, 1, long_prefix), fleet(30_000), 0.0)
        assert (kept.replica_id, kept.reason) == (holder, "prefix_affinity")
        assert tight.choose(prompt(prefix, 1, long_prefix), fleet(30_000), 0.0).replica_id != holder
        assert home_of(prefix, {holder: 30_000}) != holder
        assert r.choose(prompt(prefix, 2, long_prefix), fleet(45_000), 0.0).replica_id != holder


def test_a_short_chat_has_no_home_and_goes_by_load() -> None:
    chat = RoutingRequest.from_token_ids(MODEL, list(range(50)), 20)
    fleet = [view("a", 3_000), view("b", 1_000), view("c", 2_000), view("d", 1_500)]
    decision = router().choose(chat, fleet, 0.0)
    assert (decision.replica_id, decision.reason) == ("b", "least_load")


def test_a_replica_leaving_moves_only_the_prefixes_it_was_home_to() -> None:
    homes = HomeRanking()
    ids = [f"r{i}" for i in range(8)]
    before = {key: homes.home(key, ids, range(len(ids)), len(ids)) for key in range(500)}
    fewer = ids[:-1]
    after = {key: homes.home(key, fewer, range(len(fewer)), len(fewer)) for key in range(500)}
    moved = {key for key in before if ids[before[key]] != fewer[after[key]]}
    assert moved == {key for key in before if before[key] == len(ids) - 1}
    assert 30 < len(moved) < 100
