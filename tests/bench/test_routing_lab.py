"""Routing alone (no admission), replayed on the simulator's engines: kvgate against the baselines.

``python -m bench routing_lab`` plays one trace through the real router in front of the simulator's
``Engine``s (continuous batching, chunked prefill, prefix cache, preemption) on a virtual clock, so
every number here is a deterministic function of the trace and the policy. The trace is the
``below`` trace of ``bench.routing_lab.traces`` at 18 requests/s for 40 s (shared system prompts,
chats, long documents, long generations on four replicas of 50,000 KV tokens and 16 slots): about
as much as the fleet carries, where routing, not shedding, decides who meets the SLO.
Assertions compare policies, never wall-clock time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import pytest

from bench.routing_lab.__main__ import main
from bench.routing_lab.replay import LabResult, lab_requests, play
from bench.routing_lab.table import percentile, slot_seconds
from bench.routing_lab.traces import TRACES
from kvgate.config.routing import RoutingConfig
from kvgate.sim.profile import resolve_profile

TRACE = dataclasses.replace(TRACES["below"], rate_rps=18.0, duration_s=40.0)
POLICIES: Mapping[str, RoutingConfig] = {
    "kvgate": RoutingConfig(warmup_s=0),
    "least_request": RoutingConfig(policy="least_request"),
    "round_robin": RoutingConfig(policy="round_robin"),
}


@pytest.fixture(scope="module")
def results() -> dict[str, LabResult]:
    requests = lab_requests(TRACE.trace(1))
    profile = resolve_profile(overrides=TRACE.profile_overrides)
    return {
        name: play(requests, config, profile, TRACE.replicas, admission=False)
        for name, config in POLICIES.items()
    }


def good(result: LabResult) -> float:
    return result.good_share(TRACE.slo_ttft_s, TRACE.slo_itl_s)


def ttft(result: LabResult, q: float) -> float:
    value = percentile((o.ttft_s for o in result.outcomes if o.ttft_s is not None), q)
    assert value is not None
    return value


def test_every_request_is_served_whole_by_every_policy(results: dict[str, LabResult]) -> None:
    for result in results.values():
        assert all(not o.refused and o.tokens == o.request.routing.max_output_tokens for o in result.outcomes)


def test_kvgate_routing_beats_request_counting_and_round_robin_on_every_measure(
    results: dict[str, LabResult],
) -> None:
    kvgate = results["kvgate"]
    for baseline in (results["least_request"], results["round_robin"]):
        assert good(kvgate) > good(baseline)
        assert ttft(kvgate, 0.5) < 0.5 * ttft(baseline, 0.5)
        assert ttft(kvgate, 0.95) < 0.75 * ttft(baseline, 0.95)
        assert kvgate.hit_ratio > 1.5 * baseline.hit_ratio
        assert kvgate.preemptions < baseline.preemptions


def test_slot_seconds_split_each_served_request_at_its_first_token(results: dict[str, LabResult]) -> None:
    result = results["kvgate"]
    prefill_s, decode_s = slot_seconds(result)
    served = [o for o in result.outcomes if o.routed_s is not None and o.last_token_s is not None]
    assert served and prefill_s > 0 and decode_s > 0
    assert prefill_s + decode_s == pytest.approx(sum(o.last_token_s - o.routed_s for o in served))
    routed_first = [o for o in served if o.first_token_s is not None]
    assert prefill_s == pytest.approx(sum(o.first_token_s - o.routed_s for o in routed_first))


def test_the_command_line_prints_a_row_per_policy_and_the_slot_seconds(tmp_path: Path) -> None:
    args = ["--trace", "overload", "--duration-s", "4", "--policies", "kvgate,round_robin"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    printed = (tmp_path / "output.txt").read_text().splitlines()
    assert (
        printed[0].startswith("overload: ")
        and "4 replicas (KV 50000 tokens, 16 sequences each)" in printed[0]
    )
    assert [line.split()[0] for line in printed[2:4]] == ["kvgate", "round_robin"]
    assert [line.split()[:2] for line in printed[5:7]] == [["kvgate", "prefill"], ["round_robin", "prefill"]]


def test_the_markdown_rows_are_the_documents_table(tmp_path: Path) -> None:
    args = ["--trace", "overload", "--duration-s", "4", "--policies", "kvgate,round_robin", "--markdown"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    rows = [line for line in (tmp_path / "output.txt").read_text().splitlines() if line.startswith("|")]
    assert rows[0].startswith("| trace | admission | cache facts | policy | good % |")
    assert [row.split(" | ")[:4] for row in rows[2:]] == [
        ["| overload", "on", "routed", "kvgate"],
        ["| overload", "on", "routed", "round_robin"],
    ]
    assert all(row.count("|") == rows[0].count("|") for row in rows)
