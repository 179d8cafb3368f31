"""Each part of kvgate's placement, replayed on production-shaped traces in the routing lab.

The lab plays a shape of ``bench.traces`` through the real router in front of the simulator's
engines on a virtual clock (``bench.routing_lab``), on four full-size replicas with the objective
TTFT 1 s + prompt / 16k tokens/s and mean inter-token gap 50 ms, admission on. Each test turns one
part of the placement off and shows what it was worth; every number is a deterministic function of
the trace and the settings, and assertions compare runs, never time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from bench.routing_lab.replay import LabResult, play
from bench.routing_lab.replays import (
    SLO_ITL_S,
    SLO_TTFT_PER_PROMPT_TOKEN_S,
    SLO_TTFT_S,
    replay_requests,
    shaped,
)
from bench.routing_lab.table import percentile
from kvgate.config.routing import RoutingConfig
from kvgate.sim.profile import resolve_profile


def lab(
    shape: str, rate: float, settings: Mapping[str, Any], duration_s: float = 90.0, **options: Any
) -> LabResult:
    requests = replay_requests(shaped(shape, rate, duration_s, 0))
    profile = resolve_profile(overrides={"warmup_s": 0, **options.pop("profile", {})})
    config = RoutingConfig.model_validate({"warmup_s": 0, **settings})
    return play(requests, config, profile, 4, admission=True, max_queue_wait_s=2.0, **options)


def good(result: LabResult) -> float:
    return result.good_share(SLO_TTFT_S, SLO_ITL_S, None, SLO_TTFT_PER_PROMPT_TOKEN_S)


def ttft(result: LabResult, q: float) -> float:
    value = percentile((o.ttft_s for o in result.outcomes if o.ttft_s is not None), q)
    assert value is not None
    return value


@pytest.fixture(scope="module")
def chat() -> dict[str, LabResult]:
    return {
        "kvgate": lab("chat-fleet", 4.5, {}),
        "kvgate_events": lab("chat-fleet", 4.5, {}, kv_events=True),
        "least_request": lab("chat-fleet", 4.5, {"policy": "least_request"}),
    }


def test_placement_by_uncached_work_sends_first_tokens_sooner_than_request_counting(
    chat: dict[str, LabResult],
) -> None:
    """The fleet-wide system prompt is on every replica, so what tells them apart is each one's
    backlog of uncached prompt tokens and the conversations it still holds."""
    kvgate, baseline = chat["kvgate"], chat["least_request"]
    assert good(kvgate) > good(baseline)
    assert ttft(kvgate, 0.5) < 0.8 * ttft(baseline, 0.5)
    assert ttft(kvgate, 0.95) < 0.8 * ttft(baseline, 0.95)
    assert kvgate.hit_ratio >= baseline.hit_ratio


def test_the_replicas_own_events_place_as_well_as_what_kvgate_routed(chat: dict[str, LabResult]) -> None:
    approximate, events = chat["kvgate"], chat["kvgate_events"]
    assert abs(good(events) - good(approximate)) < 0.02
    assert events.hit_ratio == pytest.approx(approximate.hit_ratio, abs=0.02)


def test_a_replica_busy_decoding_draws_new_agents_less_than_an_idle_one() -> None:
    """Every agent shares the tools' prompt: without its decode work in its load, every agent follows
    that prompt onto the replicas already holding it, whose decoding sequences then miss their
    inter-token objective while a replica that holds nothing idles."""
    kvgate = lab("agent", 7.0, {})
    without = lab("agent", 7.0, {"decode_kv_weight": 0})
    assert good(kvgate) > 0.95
    assert good(kvgate) > good(without) + 0.2
    assert kvgate.hit_ratio >= 0.98 * without.hit_ratio


@pytest.mark.parametrize(("shape", "rate"), [("chat-fleet", 4.5), ("rag", 10.0)])
def test_events_and_the_routed_index_make_the_same_decisions_when_nothing_is_evicted(
    shape: str, rate: float
) -> None:
    """With caches too large to evict anything, what kvgate routed where is exactly what the
    replicas hold, so reading their events instead must not move a single request."""
    requests = replay_requests(shaped(shape, rate, 30.0, 0))
    profile = resolve_profile(overrides={"warmup_s": 0, "kv_capacity_tokens": 20_000_000})
    config = RoutingConfig.model_validate({"warmup_s": 0, "prefix_index_capacity_blocks": 2_000_000})
    routed = play(requests, config, profile, 4, admission=True, max_queue_wait_s=2.0)
    followed = play(requests, config, profile, 4, admission=True, max_queue_wait_s=2.0, kv_events=True)
    placements = [(o.replica, o.routed_s) for o in routed.outcomes]
    assert len({replica for replica, _ in placements}) == 4
    assert [(o.replica, o.routed_s) for o in followed.outcomes] == placements
    assert followed.hit_ratio == routed.hit_ratio > 0


def test_the_replica_holding_a_document_keeps_its_readers_within_the_ttft_tolerance() -> None:
    """Users asking about the same documents: without a tolerance every request chases the least
    backlog and documents are prefilled and cached again on replicas that did not hold them."""
    kvgate = lab("rag", 10.0, {}, duration_s=45.0)
    least_work = lab("rag", 10.0, {"ttft_tolerance_s": 0}, duration_s=45.0)
    assert kvgate.hit_ratio > least_work.hit_ratio + 0.02
    assert good(kvgate) >= good(least_work) - 0.005


def test_a_host_tier_hit_is_credited_by_the_prefill_it_saves() -> None:
    """Conversations return after the GPU caches turned over; their earlier turns are still in the
    replicas' host tier, which the events tell apart. Credited by what loading saves over computing,
    those replicas keep their conversations; credited nothing, the turns go where the GPU is idle."""
    host_tier = {"cpu_offload_tokens": 4_500_000}
    credited = lab("chat-fleet", 4.5, {}, profile=host_tier, kv_events=True)
    uncredited = lab("chat-fleet", 4.5, {"host_tier_bytes_per_s": 1}, profile=host_tier, kv_events=True)
    assert credited.tiered_hit_ratio > uncredited.tiered_hit_ratio + 0.005
    assert ttft(credited, 0.95) < 0.9 * ttft(uncredited, 0.95)
    assert good(credited) >= good(uncredited) - 0.01
