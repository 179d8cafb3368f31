"""Replays of token traces through the real routing policies on the fleet model in ``replay``.

Every assertion compares ratios between policies or against the configured bounds, never time.
"""

from __future__ import annotations

import random
import statistics
from collections import Counter
from dataclasses import replace

import pytest

from kvgate.config.routing import RoutingConfig
from kvgate.routing.ramp import ramp_weight
from kvgate.routing.request import RoutingRequest
from tests.sim.replay import (
    MODEL,
    ReplayResult,
    ReplicaSpec,
    TraceRequest,
    poisson_arrivals,
    prompt_request,
    run,
)


def heterogeneous_trace(seed: int) -> list[TraceRequest]:
    """Mostly 50-token prompts with 20-token answers, one in twenty 30,000 / 2,000."""
    rng = random.Random(seed)
    trace = []
    for arrival_s in poisson_arrivals(rng, rate_per_s=5.0, duration_s=300.0):
        big = rng.random() < 0.05
        trace.append(
            TraceRequest(arrival_s, RoutingRequest(MODEL, 30_000 if big else 50, 2_000 if big else 20))
        )
    return trace


def kv_spread(result: ReplayResult, after_s: float) -> float:
    """Mean over samples of the coefficient of variation of KV tokens resident per replica."""
    spreads = []
    for now_s, kv_tokens in result.kv_samples:
        mean = statistics.fmean(kv_tokens.values())
        if now_s >= after_s and mean > 0:
            spreads.append(statistics.pstdev(kv_tokens.values()) / mean)
    return statistics.fmean(spreads)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_least_outstanding_tokens_keeps_kv_far_more_even_than_round_robin(seed: int) -> None:
    fleet = [ReplicaSpec(f"r{i}") for i in range(4)]
    trace = heterogeneous_trace(seed)
    kvgate = run(fleet, trace, RoutingConfig())
    round_robin = run(fleet, trace, RoutingConfig(policy="round_robin"))
    assert len(kvgate.placements) == len(round_robin.placements) == len(trace)
    assert kv_spread(kvgate, after_s=30.0) < 0.5 * kv_spread(round_robin, after_s=30.0)


def shared_prompt_trace(seed: int, prompts: int = 8) -> list[TraceRequest]:
    """Each request: one of ``prompts`` 2,048-token system prompts (Zipf-popular) + 256 own tokens."""
    rng = random.Random(seed)
    systems = [[1_000_000 * (p + 1) + i for i in range(2_048)] for p in range(prompts)]
    popularity = [1.0 / (p + 1) for p in range(prompts)]
    trace = []
    for arrival_s in poisson_arrivals(rng, rate_per_s=12.0, duration_s=90.0):
        system = systems[rng.choices(range(prompts), popularity)[0]]
        user = [rng.randrange(100_000) for _ in range(256)]
        trace.append(TraceRequest(arrival_s, prompt_request(system + user, 128)))
    return trace


PREFIX_FLEET = [ReplicaSpec(f"r{i}", kv_capacity_tokens=100_000, cache_capacity_blocks=400) for i in range(6)]


def max_request_share(result: ReplayResult) -> float:
    counts = Counter(p.decision.replica_id for p in result.placements)
    return max(counts.values()) / len(result.placements)


def test_the_replica_caching_a_prompt_keeps_it_within_the_tolerance_and_hits_more_than_round_robin() -> None:
    trace = shared_prompt_trace(seed=1)
    config = RoutingConfig(prefix_index_capacity_blocks=400)
    kvgate = run(PREFIX_FLEET, trace, config)
    round_robin = run(PREFIX_FLEET, trace, RoutingConfig(policy="round_robin"))
    assert kvgate.hit_ratio() > 2.0 * round_robin.hit_ratio()
    assert kvgate.hit_ratio() > 0.7

    affinity = [p for p in kvgate.placements if p.decision.reason == "prefix_affinity"]
    assert len(affinity) > 0.8 * len(kvgate.placements)
    bound_tokens = PREFIX_FLEET[0].prefill_tokens_per_s * config.ttft_tolerance_s
    for placement in affinity:
        scores = placement.decision.scores
        chosen = placement.decision.score_of(placement.decision.replica_id or "")
        assert chosen is not None and len(scores) == len(PREFIX_FLEET)
        assert chosen.cached_tokens == max(s.cached_tokens for s in scores)
        assert chosen.backlog_tokens - min(s.backlog_tokens for s in scores) <= bound_tokens

    # Requests that hit are cheap (their prefill is skipped), so the replica caching the hottest
    # prompt serves more of them than its share; on replicas slow enough for its backlog to grow
    # past the tolerance, it spills the rest.
    slow = [replace(spec, prefill_tokens_per_s=4_000.0) for spec in PREFIX_FLEET]
    bounded = run(slow, trace, config)
    patient = run(slow, trace, config.model_copy(update={"ttft_tolerance_s": 1_000.0}))
    assert max_request_share(patient) > 0.3
    assert max_request_share(bounded) < 0.8 * max_request_share(patient)


MANY_PREFIX_FLEET = [
    ReplicaSpec(f"r{i}", kv_capacity_tokens=100_000, cache_capacity_blocks=600) for i in range(4)
]


@pytest.mark.parametrize("prompts", [16, 32])
def test_many_prompts_partition_over_the_fleet_and_hit_far_more_than_round_robin(prompts: int) -> None:
    """More system prompts than one replica's cache holds, but not more than the fleet's: each
    stays with the replica that first cached it while that one's backlog is within the tolerance."""
    trace = shared_prompt_trace(seed=1, prompts=prompts)
    kvgate = run(MANY_PREFIX_FLEET, trace, RoutingConfig())
    round_robin = run(MANY_PREFIX_FLEET, trace, RoutingConfig(policy="round_robin"))
    assert kvgate.hit_ratio() > 1.5 * round_robin.hit_ratio()


def steady_trace(seed: int, duration_s: float) -> list[TraceRequest]:
    rng = random.Random(seed)
    return [
        TraceRequest(arrival_s, RoutingRequest(MODEL, 500, 100))
        for arrival_s in poisson_arrivals(rng, rate_per_s=20.0, duration_s=duration_s)
    ]


def expected_share(start_s: float, end_s: float, ready_s: float, config: RoutingConfig, fair: float) -> float:
    """Mean over the window of the ramp weight, capped at the fair share it ramps towards."""
    steps = 1_000
    width_s = (end_s - start_s) / steps
    weights = [
        min(
            fair,
            ramp_weight(
                start_s + (i + 0.5) * width_s - ready_s, config.warmup_s, config.min_ratio, config.aggression
            ),
        )
        for i in range(steps)
    ]
    return statistics.fmean(weights)


def test_cold_replica_share_ramps_as_configured() -> None:
    fleet = [ReplicaSpec("warm"), ReplicaSpec("cold", ready_since_s=10.0)]
    trace = steady_trace(seed=3, duration_s=100.0)
    config = RoutingConfig(warmup_s=60.0, min_ratio=0.1, aggression=1.0)
    result = run(fleet, trace, config)

    assert result.share("cold", 0.0, 10.0) == 0.0
    ramping = [(10.0, 20.0), (20.0, 30.0)]
    shares = [result.share("cold", start_s, end_s) for start_s, end_s in ramping]
    for share, (start_s, end_s) in zip(shares, ramping, strict=True):
        assert share == pytest.approx(expected_share(start_s, end_s, 10.0, config, 0.5), abs=0.05)
    assert shares[0] < shares[1] < result.share("cold", 30.0, 40.0)
    assert result.share("cold", 70.0, 100.0) == pytest.approx(0.5, abs=0.03)

    faster = run(fleet, trace, config.model_copy(update={"aggression": 3.0}))
    assert faster.share("cold", 10.0, 20.0) > 2.0 * shares[0]
    unramped = run(fleet, trace, config.model_copy(update={"warmup_s": 0.0}))
    assert unramped.share("cold", 10.0, 20.0) == pytest.approx(0.5, abs=0.05)
