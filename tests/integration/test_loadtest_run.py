"""The load generator end to end: against the simulator directly and through kvgate, with the
report's numbers checked against what the simulator's own ``/metrics`` counted."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from kvgate.gateway.edge.server import running_gateway
from kvgate.loadtest.client import RetryPolicy
from kvgate.loadtest.compare import ratios, run_compare
from kvgate.loadtest.plots import signal_series
from kvgate.loadtest.report import Slo, summarize, write_report
from kvgate.loadtest.runner import RunOptions, Target, run
from kvgate.loadtest.workload import Trace, build_trace
from kvgate.loadtest.workload_file import load_workload, parse_workload, with_overrides
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import assert_idle, gateway_config

SMALL = {
    "name": "small",
    "duration_s": 1.5,
    "rate_rps": 12,
    "slo_ttft_s": 5.0,
    "slo_itl_s": 1.0,
    "classes": [
        {
            "name": "short",
            "weight": 3,
            "prompt_tokens": {"uniform": [20, 80]},
            "output_tokens": {"uniform": [4, 16]},
        },
        {"name": "longer", "weight": 1, "prompt_tokens": 600, "output_tokens": 24},
    ],
}
SLO = Slo(ttft_s=5.0, itl_s=1.0)


def small_trace(seed: int = 0, **changes: object) -> Trace:
    return build_trace(parse_workload({**SMALL, **changes}), seed)


async def simulator_counts(urls: Sequence[str]) -> dict[str, float]:
    """Successful requests, prompt and generation tokens summed over replicas' ``/metrics``."""
    totals = {
        "vllm:request_success_total": 0.0,
        "vllm:prompt_tokens_total": 0.0,
        "vllm:generation_tokens_total": 0.0,
    }
    async with aiohttp.ClientSession() as session:
        for url in urls:
            async with session.get(url + "/metrics") as response:
                text = await response.text()
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name in totals:
                        totals[sample.name] += sample.value
    return totals


async def test_report_matches_what_the_simulator_counted(tmp_path: Path) -> None:
    trace = small_trace()
    async with SimFleet(replicas=1, time_scale=0.02, seed=0) as fleet:
        result = await run(Target("sim", fleet.urls[0]), trace)
        counts = await simulator_counts(fleet.urls)
    summary = summarize(result, SLO)
    assert summary.requests == len(trace.requests) > 5
    assert summary.ok == summary.requests
    assert counts["vllm:request_success_total"] == summary.ok
    assert counts["vllm:prompt_tokens_total"] == summary.prompt_tokens
    assert counts["vllm:generation_tokens_total"] == summary.completion_tokens
    assert summary.completion_tokens == sum(r.max_tokens for r in trace.requests)
    assert all(r.ttft_s is not None and r.ttft_s <= r.e2e_s for r in result.records)
    assert all(len(r.itl_s) == r.completion_tokens - 1 for r in result.records)
    assert not result.signals

    paths = write_report(tmp_path, trace, [result], SLO)
    assert {p.name for p in paths} >= {
        "report.md",
        "results.json",
        "ttft_cdf.png",
        "itl_cdf.png",
        "rates.png",
    }
    saved = orjson.loads((tmp_path / "results.json").read_bytes())
    assert saved["summaries"][0]["requests"] == counts["vllm:request_success_total"]
    assert saved["summaries"][0]["prompt_tokens"] == counts["vllm:prompt_tokens_total"]
    assert saved["summaries"][0]["completion_tokens"] == counts["vllm:generation_tokens_total"]
    assert len(saved["runs"][0]["records"]) == len(trace.requests)
    report = (tmp_path / "report.md").read_text()
    assert "Summary" in report
    assert "By request class" in report


async def test_report_matches_the_simulator_through_kvgate(tmp_path: Path) -> None:
    trace = small_trace(seed=1)
    async with SimFleet(replicas=2, time_scale=0.02, seed=0) as fleet:
        async with running_gateway(gateway_config(fleet.urls)) as gw:
            result = await run(Target("kvgate", gw.url), trace, RunOptions(signals_interval_s=0.2))
            await assert_idle(gw)
        counts = await simulator_counts(fleet.urls)
    summary = summarize(result, SLO)
    assert summary.requests == len(trace.requests)
    assert summary.ok + summary.rejects == summary.requests
    assert counts["vllm:request_success_total"] == summary.ok
    assert counts["vllm:prompt_tokens_total"] == summary.prompt_tokens
    assert counts["vllm:generation_tokens_total"] == summary.completion_tokens
    series = signal_series(result.signals)
    assert set(series) == {"default"}
    assert len(series["default"]["t_s"]) == len(result.signals) > 0
    paths = write_report(tmp_path, trace, [result], SLO)
    assert tmp_path / "kvgate_signals.png" in paths


CAP_S = 2.0


async def test_kvgate_rejects_are_counted_and_retry_after_is_honoured() -> None:
    overload = {"duration_s": 1.0, "rate_rps": 20, "classes": [{"prompt_tokens": 1500, "output_tokens": 200}]}
    tight = {"name": "default", "kv_capacity_tokens": 6000}
    async with SimFleet(replicas=1, time_scale=0.3, seed=0) as fleet:
        # The forecast drain (200 tokens at the simulator's pace) within the cap: a refusal
        # without room held for its retry says x-should-retry: false, and this test is about the
        # ones that hold it. Each run has a gateway of its own, so no promise carries over.
        config = gateway_config(
            fleet.urls,
            pools=[{**tight, "replicas": list(fleet.urls)}],
            admission={"max_queue_wait_s": 0.0, "retry_after_cap_s": CAP_S, "default_inter_token_s": 0.005},
        )
        async with running_gateway(config) as gw:
            plain = await run(Target("kvgate", gw.url), build_trace(parse_workload(overload), 0))
            await assert_idle(gw)
        async with running_gateway(config) as gw:
            retrying = await run(
                Target("kvgate", gw.url),
                build_trace(parse_workload(overload), 0, salt=1),
                RunOptions(retry=RetryPolicy(max_retries=5)),
            )
            await assert_idle(gw)
        counts = await simulator_counts(fleet.urls)
    first, second = summarize(plain, SLO), summarize(retrying, SLO)
    assert first.rejects > 0
    assert first.retries == 0
    assert second.retries > 0
    for record in (r for r in retrying.records if r.retries):
        # Each wait was the server's retry-after-ms (at most the cap), not a back-off of its own.
        assert 0 < record.wait_honoured_s <= CAP_S * record.retries + 1e-9
        if record.ok:
            assert record.ttft_s is not None
            assert record.ttft_s > record.wait_honoured_s
    assert counts["vllm:request_success_total"] == first.ok + second.ok
    assert counts["vllm:prompt_tokens_total"] == first.prompt_tokens + second.prompt_tokens
    assert counts["vllm:generation_tokens_total"] == first.completion_tokens + second.completion_tokens


async def test_closed_loop_keeps_concurrency_and_counts_match() -> None:
    trace = small_trace(concurrency=3, max_requests=12)
    async with SimFleet(replicas=1, time_scale=0.02, seed=0) as fleet:
        result = await run(Target("sim", fleet.urls[0] + "/v1"), trace)
        counts = await simulator_counts(fleet.urls)
    assert result.trace_exhausted
    assert len(result.records) == 12
    assert all(r.lag_s is None for r in result.records)
    assert counts["vllm:request_success_total"] == 12


async def test_compare_plays_the_same_trace_to_every_target(tmp_path: Path) -> None:
    trace = small_trace(seed=2, duration_s=1.0)
    async with SimFleet(replicas=2, time_scale=0.02, seed=0) as fleet:
        targets = [Target("a", fleet.urls[0]), Target("b", fleet.urls[1])]
        results = await run_compare(targets, trace, RunOptions(), slice_count=2)
        counts = [await simulator_counts([url]) for url in fleet.urls]
    assert [r.target.name for r in results] == ["a", "b"]
    for result, count in zip(results, counts, strict=True):
        assert [r.index for r in result.records] == [r.index for r in trace.requests]
        assert count["vllm:request_success_total"] == len(trace.requests)
    # Own texts per target, same lengths: the server's count differs at most where its chat template
    # meets the text's last token.
    for first, second in zip(results[0].records, results[1].records, strict=True):
        assert abs(first.prompt_tokens - second.prompt_tokens) <= 2
        assert first.completion_tokens == second.completion_tokens
    summaries = [summarize(r, SLO) for r in results]
    table = ratios(summaries, "a")
    assert table["a"]["goodput"] == 1.0
    write_report(tmp_path, trace, results, SLO, ratios=table, baseline="a")
    assert "Ratios against `a`" in (tmp_path / "report.md").read_text()


async def _prefix_cache_hit_ratio(workload: str) -> float:
    trace = build_trace(with_overrides(load_workload(workload), duration_s=1.5, rate_rps=10.0), 0)
    async with SimFleet(replicas=1, time_scale=0.01, seed=0) as fleet:
        await run(Target("sim", fleet.urls[0]), trace)
        async with aiohttp.ClientSession() as session, session.get(fleet.urls[0] + "/metrics") as response:
            text = await response.text()
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    return float(values["vllm:prefix_cache_hits_total"] / values["vllm:prefix_cache_queries_total"])


async def test_only_shared_prefixes_hit_the_prefix_cache() -> None:
    assert await _prefix_cache_hit_ratio("chat") < 0.1
    assert await _prefix_cache_hit_ratio("shared-prefix") > 0.5
