"""Sizing gateways' claims on a replica: max-min fair over what each wants, what nobody wants split
evenly, never below what is in use, never past what the other claims leave; a shrinking claim
shrinks locally before Redis hears of it, a growing one only once granted."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvgate.admission.claims import (
    ClaimBook,
    Grant,
    ReplicaDemand,
    Share,
    fair_level,
    fair_share,
    grant,
    replica_capacity,
    spread,
    target,
)
from kvgate.vocabulary.capacity import fits
from kvgate.vocabulary.replica import ReplicaLoad, ReplicaView, Role

CAPACITY = Share(1200, 12)


@pytest.mark.parametrize(
    ("capacity", "wants", "level"),
    [
        (1200, [], 1200),
        (1200, [0, 0], 1200),
        (1200, [100, 200], 1200),
        (1200, [600, 600], 1200),
        (1200, [1200, 1200], 600),
        (1200, [100, 2000], 1100),
        (1200, [100, 2000, 2000], 550),
        (1200, [1000, 1000, 1000, 1000], 300),
        (10, [4, 4, 4], 3),
        (0, [5], 0),
    ],
)
def test_fair_level(capacity: int, wants: list[int], level: int) -> None:
    assert fair_level(capacity, wants) == level


@pytest.mark.parametrize(
    ("mine", "others", "share"),
    [
        (Share(), [], CAPACITY),
        (Share(), [Share()], Share(600, 6)),
        (Share(), [Share(), Share(), Share()], Share(300, 3)),
        (Share(1200, 12), [Share()], CAPACITY),
        (Share(), [Share(1200, 12)], Share()),
        (Share(1200, 12), [Share(1200, 12)], Share(600, 6)),
        (Share(200, 2), [Share(2000, 20)], Share(200, 2)),
        (Share(200, 2), [Share(400, 4)], Share(500, 5)),
        (Share(2000, 1), [Share(100, 11)], Share(1100, 1)),
    ],
)
def test_fair_share_is_max_min_fair_with_the_unwanted_split_evenly(
    mine: Share, others: list[Share], share: Share
) -> None:
    assert fair_share(CAPACITY, mine, others) == share


@pytest.mark.parametrize(
    ("demand", "others", "asked"),
    [
        (ReplicaDemand(CAPACITY, Share(900, 9)), [Share(1200, 12)], Share(900, 9)),
        (ReplicaDemand(CAPACITY, Share(100, 1), Share(1100, 11)), [Share(1200, 12)], Share(600, 6)),
        (ReplicaDemand(CAPACITY, Share(), Share(5000, 50)), [], CAPACITY),
    ],
)
def test_a_claim_never_shrinks_below_what_is_in_use(
    demand: ReplicaDemand, others: list[Share], asked: Share
) -> None:
    assert target(demand, others) == asked


@pytest.mark.parametrize(
    ("asked", "others_claim", "granted"),
    [
        (Share(600, 6), Share(), Share(600, 6)),
        (Share(600, 6), Share(1000, 2), Share(200, 6)),
        (Share(600, 6), Share(1300, 13), Share()),
    ],
)
def test_grant_is_what_the_other_claims_leave(asked: Share, others_claim: Share, granted: Share) -> None:
    assert grant(asked, CAPACITY, others_claim) == granted


@given(
    st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 3000)), min_size=1, max_size=6),
    st.integers(0, 2000),
)
def test_fair_shares_of_everyone_never_sum_past_the_capacity(wants: list[tuple[int, int]], kv: int) -> None:
    capacity = Share(kv, 16)
    shares = [Share(w, u % 17) for w, u in wants]
    total = Share()
    for i, mine in enumerate(shares):
        total = total + fair_share(capacity, mine, shares[:i] + shares[i + 1 :])
    assert total.kv_tokens <= capacity.kv_tokens and total.sequences <= capacity.sequences


def test_replica_capacity_is_its_kv_and_its_slots_under_the_guard() -> None:
    assert replica_capacity(1000, 0, 128) == Share(1000, 128)
    assert replica_capacity(1000, 64, 128) == Share(1000, 64)
    assert replica_capacity(1000, 256, 128) == Share(1000, 128)


def test_unmet_demand_is_spread_by_capacity_rounding_up() -> None:
    capacities = {"a": Share(1000, 10), "b": Share(3000, 30)}
    assert spread(Share(401, 3), capacities) == {"a": Share(101, 1), "b": Share(301, 3)}
    assert spread(Share(5, 1), {}) == {}


def test_a_shrinking_claim_shrinks_before_redis_hears_a_growing_one_waits_for_the_grant() -> None:
    book = ClaimBook()
    book.granted({"r0": Grant(Share(600, 6), Share(600, 6), (Share(),))}, {"r0": CAPACITY})
    assert book.others_load() == {"r0": ReplicaLoad(0, 6, 0, 600)}

    book.others_want["r0"] = (Share(1200, 12),)
    asked = book.plan({"r0": ReplicaDemand(CAPACITY, Share(100, 1), Share(300, 3))})
    assert asked == {"r0": Share(400, 4)}
    assert book.claimed() == {"r0": Share(400, 4)}, "given back at once, before Redis hears"

    book.others_want["r0"] = ()
    assert book.plan({"r0": ReplicaDemand(CAPACITY, Share(100, 1), Share(1100, 11))}) == {"r0": CAPACITY}
    assert book.claimed() == {"r0": Share(400, 4)}, "not used before Redis grants it"
    book.granted({"r0": Grant(Share(1000, 10), Share(200, 2))}, {"r0": CAPACITY})
    assert book.claimed() == {"r0": Share(1000, 10)}

    book.granted({"r0": None}, {})
    assert book.claimed() == {} and book.others_load() == {}
    assert book.plan({}) == {}


@pytest.mark.parametrize(
    ("used", "claim", "request_kv", "admitted"), [(0, 600, 600, True), (100, 600, 501, False)]
)
def test_others_load_makes_fits_answer_whether_a_request_fits_the_claim(
    used: int, claim: int, request_kv: int, admitted: bool
) -> None:
    book = ClaimBook()
    book.granted({"r0": Grant(Share(claim, 6), Share())}, {"r0": CAPACITY})
    other = book.others_load()["r0"]
    load = ReplicaLoad(0, 1 + other.resident_sequences, 0, used + other.reserved_kv_tokens)
    view = ReplicaView("r0", "http://r0", "p", Role.MIXED, frozenset({"m"}), 1200, 12, True, 0.0, load)
    assert fits(view, request_kv, 1, CAPACITY.sequences) is admitted
