"""What the goodput benchmark reads off each target's run and fleet: the replicas' prefix-cache and
preemption counters, the simulator's lag, and what became of the requests refused at first."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from bench.harness.metrics import scrape_all
from kvgate.loadtest.client import RequestRecord
from kvgate.loadtest.report import Summary, percentile
from kvgate.loadtest.runner import RunResult

HITS = "vllm:prefix_cache_hits_total"
HOST_HITS = "vllm:external_prefix_cache_hits_total"
"""Prompt tokens loaded from the host tier (vLLM counts its offloading connector's hits apart)."""
QUERIES = "vllm:prefix_cache_queries_total"
FIRST_HITS = "kvgate_sim_first_schedule_prefix_hits_total"
FIRST_QUERIES = "kvgate_sim_first_schedule_prefix_queries_total"
PREEMPTIONS = "vllm:num_preemptions_total"
LAG = "kvgate_sim_lag_ratio"


@dataclass(frozen=True, slots=True)
class FleetCounters:
    prefix_hits_tokens: float
    prefix_queries_tokens: float
    host_hits_tokens: float
    first_schedule_hits_tokens: float
    first_schedule_queries_tokens: float
    preemptions: float
    lag_ratio: float
    """The worst replica's ``kvgate_sim_lag_ratio`` (cumulative lag over busy time)."""


async def fleet_counters(session: aiohttp.ClientSession, urls: Sequence[str]) -> FleetCounters:
    page = await scrape_all(
        session, urls, (HITS, QUERIES, HOST_HITS, FIRST_HITS, FIRST_QUERIES, PREEMPTIONS, LAG)
    )
    return FleetCounters(
        page.sum(HITS),
        page.sum(QUERIES),
        page.sum(HOST_HITS),
        page.sum(FIRST_HITS),
        page.sum(FIRST_QUERIES),
        page.sum(PREEMPTIONS),
        page.max(LAG),
    )


@dataclass(frozen=True, slots=True)
class PolicyRun:
    policy: str
    summary: Summary
    result: RunResult
    hit_ratio: float
    preemptions: int
    lag_ratio: float
    hit_tokens: float = 0.0
    """Prompt tokens the replicas found in their prefix cache: prefill saved. A preempted sequence's
    prompt, scheduled again, queries (and hits) a second time, so this and the hit rate count it."""
    prefilled_tokens: float = 0.0
    """Prompt tokens the replicas computed (queries less hits), re-prefills after preemption included."""
    host_hit_ratio: float = 0.0
    """Prompt tokens loaded from the host tier over prompt tokens queried: beside ``hit_ratio``, the
    share of prefill a host tier saved (at a lower saving per token)."""
    first_schedule_hit_ratio: float = 0.0
    """The hit rate over each request's first schedule only (``kvgate_sim_first_schedule_prefix_*``):
    what routing found cached for the prompts it placed, without the preempted prompts that, scheduled
    again, find their own blocks."""

    @classmethod
    def of(
        cls, result: RunResult, summary: Summary, before: FleetCounters, after: FleetCounters
    ) -> PolicyRun:
        """The run of one target, with its fleet's counters over the run."""
        queries = after.prefix_queries_tokens - before.prefix_queries_tokens
        hits = after.prefix_hits_tokens - before.prefix_hits_tokens
        first_hits = after.first_schedule_hits_tokens - before.first_schedule_hits_tokens
        first_queries = after.first_schedule_queries_tokens - before.first_schedule_queries_tokens
        return cls(
            result.target.name,
            summary,
            result,
            hits / queries if queries else 0.0,
            int(after.preemptions - before.preemptions),
            after.lag_ratio,
            hits,
            queries - hits,
            (after.host_hits_tokens - before.host_hits_tokens) / queries if queries else 0.0,
            first_hits / first_queries if first_queries else 0.0,
        )


def fmt(value: float | None, scale: float = 1.0, digits: int = 3) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


@dataclass(frozen=True, slots=True)
class RetryOutcomes:
    """What became of the requests refused at their first attempt (with ``--retries``): ``retried``
    came back after the Retry-After they were given, ``first_retry_ok`` were admitted then, and
    ``told_not_to_retry`` were refused with ``x-should-retry: false`` or a wait past the client's."""

    refused_first: int
    retried: int
    first_retry_ok: int
    told_not_to_retry: int
    admitted_ttft_p95_s: float | None
    """TTFT of the attempt that was admitted (the wait out of a Retry-After taken off)."""

    @classmethod
    def of(cls, records: Sequence[RequestRecord]) -> RetryOutcomes:
        retried = [r for r in records if r.retries >= 1]
        stopped = [r for r in records if r.retries == 0 and r.rejected]
        return cls(
            len(retried) + len(stopped),
            len(retried),
            sum(1 for r in retried if r.retries == 1 and r.ok),
            len(stopped),
            percentile(
                [r.ttft_s - r.wait_honoured_s for r in records if r.ok and r.ttft_s is not None], 0.95
            ),
        )

    def line(self) -> str:
        share = f"{self.first_retry_ok / self.retried:.0%}" if self.retried else "-"
        return (
            f"refused at first {self.refused_first}, retried {self.retried}, first retry admitted "
            f"{self.first_retry_ok} ({share}), told not to retry {self.told_not_to_retry}; TTFT p95 of "
            f"the admitted attempt {fmt(self.admitted_ttft_p95_s)} s"
        )
