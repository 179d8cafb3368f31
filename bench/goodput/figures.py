"""What the goodput benchmark reads off each target's run and fleet: the replicas' prefix-cache and
preemption counters, the simulator's lag, and what became of the requests refused at first."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from bench.harness.metrics import Page, scrape, scrape_all
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
    trust: PromiseTrust | None = None
    """A kvgate gateway's promises and forecast errors over the run (None for the other targets)."""

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
    came back (after the server's Retry-After or the client's own back-off), ``first_retry_ok`` were
    admitted at their first retry, ``honoured`` and ``honoured_ok`` the same for the clients whose
    first retry waited the Retry-After they were given, and ``told_not_to_retry`` were refused with
    ``x-should-retry: false`` or a wait past the client's ceiling."""

    refused_first: int
    retried: int
    first_retry_ok: int
    told_not_to_retry: int
    admitted_ttft_p95_s: float | None
    """TTFT of the attempt that was admitted (the wait out of a Retry-After taken off)."""
    honoured: int = 0
    honoured_ok: int = 0

    @classmethod
    def of(cls, records: Sequence[RequestRecord]) -> RetryOutcomes:
        retried = [r for r in records if r.retries >= 1]
        stopped = [r for r in records if r.retries == 0 and r.rejected]
        honoured = [r for r in retried if r.honoured_retry_after]
        return cls(
            len(retried) + len(stopped),
            len(retried),
            sum(1 for r in retried if r.retries == 1 and r.ok),
            len(stopped),
            percentile(
                [r.ttft_s - r.wait_honoured_s for r in records if r.ok and r.ttft_s is not None], 0.95
            ),
            len(honoured),
            sum(1 for r in honoured if r.retries == 1 and r.ok),
        )

    @property
    def honoured_ok_ratio(self) -> float | None:
        return self.honoured_ok / self.honoured if self.honoured else None

    def line(self) -> str:
        share = f"{self.first_retry_ok / self.retried:.0%}" if self.retried else "-"
        kept = self.honoured_ok_ratio
        return (
            f"refused at first {self.refused_first}, retried {self.retried}, first retry admitted "
            f"{self.first_retry_ok} ({share}); of those that waited the Retry-After {self.honoured_ok} of "
            f"{self.honoured} ({'-' if kept is None else f'{kept:.0%}'}); told not to retry "
            f"{self.told_not_to_retry}; TTFT p95 of the admitted attempt {fmt(self.admitted_ttft_p95_s)} s"
        )


PROMISES = "kvgate_promises_total"
PROMISE_OUTCOMES = ("made", "kept", "broken", "lapsed")
QUEUE_FORECAST_ERROR = "kvgate_queue_wait_forecast_error_seconds"
PROMISE_FORECAST_ERROR = "kvgate_promise_forecast_error_seconds"


@dataclass(frozen=True, slots=True)
class Histogram:
    """A Prometheus histogram's cumulative buckets (upper bound, count), ``+Inf`` last."""

    buckets: tuple[tuple[float, float], ...]

    @classmethod
    def read(cls, page: Page, name: str) -> Histogram:
        """``name``'s buckets summed over its series."""
        totals: dict[float, float] = {}
        for sample in page.samples:
            if sample.name == name + "_bucket":
                bound = float(sample.labels["le"])
                totals[bound] = totals.get(bound, 0.0) + sample.value
        return cls(tuple(sorted(totals.items())))

    def minus(self, before: Histogram) -> Histogram:
        earlier = dict(before.buckets)
        return Histogram(tuple((bound, n - earlier.get(bound, 0.0)) for bound, n in self.buckets))

    @property
    def count(self) -> int:
        return int(self.buckets[-1][1]) if self.buckets else 0

    def quantile(self, q: float) -> float | None:
        """The upper bound of the bucket holding the ``q`` quantile (Prometheus' estimate is no finer)."""
        total = self.count
        if not total:
            return None
        rank = q * total
        for bound, n in self.buckets:
            if n >= rank:
                return bound
        return math.inf


@dataclass(frozen=True, slots=True)
class PromiseTrust:
    """Whether a gateway's Retry-After could be trusted over the run, from its own ``/metrics``:
    promises made, kept, broken and lapsed; the error of the waits it forecast for queued requests
    and, for promises, the time their room was there less the time promised."""

    made: int
    kept: int
    broken: int
    lapsed: int
    queue_error: Histogram
    promise_error: Histogram

    @classmethod
    def between(cls, before: Page, after: Page) -> PromiseTrust:
        made, kept, broken, lapsed = (
            int(after.sum(PROMISES, {"outcome": o}) - before.sum(PROMISES, {"outcome": o}))
            for o in PROMISE_OUTCOMES
        )
        queue, promise = (
            Histogram.read(after, name).minus(Histogram.read(before, name))
            for name in (QUEUE_FORECAST_ERROR, PROMISE_FORECAST_ERROR)
        )
        return cls(made, kept, broken, lapsed, queue, promise)

    def line(self) -> str:
        def quantiles(h: Histogram) -> str:
            if not h.count:
                return "none"
            return f"p50 {h.quantile(0.5):+g} s, p95 {h.quantile(0.95):+g} s (le, {h.count} observed)"

        return (
            f"promises made {self.made}, kept {self.kept}, broken {self.broken}, lapsed {self.lapsed}; "
            f"forecast error: promises {quantiles(self.promise_error)}; queued "
            f"{quantiles(self.queue_error)}"
        )


async def gateway_page(session: aiohttp.ClientSession, url: str) -> Page:
    return await scrape(session, url, (PROMISES, QUEUE_FORECAST_ERROR, PROMISE_FORECAST_ERROR))
