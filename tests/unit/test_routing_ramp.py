from __future__ import annotations

import random
from dataclasses import replace

import pytest

from kvgate.routing.ramp import Ramp, ramp_weight
from kvgate.vocabulary.replica import ReplicaLoad, ReplicaView, Role


def view(replica_id: str, ready_since_s: float | None = 0.0, ttft_ewma_s: float | None = None) -> ReplicaView:
    return ReplicaView(
        replica_id,
        f"http://{replica_id}",
        "default",
        Role.MIXED,
        frozenset({"m"}),
        10_000,
        8,
        True,
        ready_since_s,
        ReplicaLoad(),
        ttft_ewma_s=ttft_ewma_s,
    )


@pytest.mark.parametrize(
    ("ready_for_s", "aggression", "weight"),
    [
        (0.0, 1.0, 0.1),
        (3.0, 1.0, 0.1),
        (30.0, 1.0, 0.5),
        (45.0, 1.0, 0.75),
        (60.0, 1.0, 1.0),
        (600.0, 1.0, 1.0),
        (15.0, 2.0, 0.5),
        (15.0, 0.5, 0.1),
        (30.0, 0.5, 0.25),
    ],
)
def test_envoy_slow_start_weight(ready_for_s: float, aggression: float, weight: float) -> None:
    assert ramp_weight(ready_for_s, 60.0, 0.1, aggression) == pytest.approx(weight)


def test_no_window_means_no_ramp() -> None:
    assert ramp_weight(0.0, 0.0, 0.1, 1.0) == 1.0


RAMP = Ramp(warmup_s=60.0, min_ratio=0.1, aggression=1.0, cold_ttft_factor=3.0)


def test_ttft_far_above_the_pool_counts_as_cold() -> None:
    views = [view("a", -600.0, 0.2), view("b", -600.0, 0.25), view("c", -600.0, 1.0), view("d", -600.0)]
    assert RAMP.weights(views, now_s=0.0) == [1.0, 1.0, 0.1, 1.0]


def test_millisecond_ttfts_three_times_apart_are_noise_not_a_cold_replica() -> None:
    views = [view("a", -600.0, 0.002), view("b", -600.0, 0.003), view("c", -600.0, 0.040)]
    assert RAMP.weights(views, now_s=0.0) == [1.0, 1.0, 1.0]
    assert RAMP.keep(views, 0.0, random.Random(0)) == views


def test_keep_probability_follows_the_weight() -> None:
    rng = random.Random(5)
    warm, cold = view("warm", -600.0), view("cold", -15.0)
    kept = sum(
        1 for _ in range(4_000) if any(v.replica_id == "cold" for v in RAMP.keep([warm, cold], 0.0, rng))
    )
    assert 0.22 < kept / 4_000 < 0.28


def test_keep_never_empties_the_decision() -> None:
    rng = random.Random(1)
    cold = [view("a", 0.0), view("b", 0.0)]
    assert all(len(RAMP.keep(cold, 0.0, rng)) >= 1 for _ in range(200))
    assert RAMP.keep([replace(cold[0], ready_since_s=-60.0)], 0.0, rng) == [
        replace(cold[0], ready_since_s=-60.0)
    ]
