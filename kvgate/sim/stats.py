"""Counters and histograms one simulated engine keeps, in simulated seconds.

These are what ``/metrics`` renders under vLLM v1's names. Histogram bucket bounds follow vLLM's,
so dashboards and the gateway's scraper read the simulator exactly as they would read vLLM.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_BUCKETS_S = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


class Histogram:
    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.sum += value * times
        self.count += times

    def cumulative(self) -> list[int]:
        total = 0
        out = []
        for c in self.counts:
            total += c
            out.append(total)
        return out


@dataclass(slots=True)
class EngineStats:
    num_preemptions: int = 0
    prefix_cache_queries_tokens: int = 0
    prefix_cache_hits_tokens: int = 0
    first_schedule_queries_tokens: int = 0
    """As ``prefix_cache_queries_tokens``, each request's first schedule only: a preempted request's
    prompt, scheduled again, finds its own blocks cached and counts a second time above, not here."""
    first_schedule_hits_tokens: int = 0
    external_prefix_cache_queries_tokens: int = 0
    """vLLM's connector lookups: the host tier's (and a decode instance's transferred prompts)."""
    external_prefix_cache_hits_tokens: int = 0
    cached_tokens_by_source: dict[str, int] = field(
        default_factory=lambda: {"device": 0, "host": 0, "p2p": 0, "disk": 0, "external_unspecified": 0}
    )
    """Prompt tokens each request's first admission found computed, by the tier that held them."""
    prompt_tokens_by_source: dict[str, int] = field(
        default_factory=lambda: {"local_compute": 0, "local_cache_hit": 0, "external_kv_transfer": 0}
    )
    """Prompt tokens of requests that produced their first token, by where their KV came from."""
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_steps: int = 0
    busy_s: float = 0.0
    request_success: dict[str, int] = field(default_factory=lambda: {"stop": 0, "length": 0, "abort": 0})
    ttft_s: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS_S))
    itl_s: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS_S))
    e2e_s: Histogram = field(default_factory=lambda: Histogram(REQUEST_BUCKETS_S))
    queue_s: Histogram = field(default_factory=lambda: Histogram(REQUEST_BUCKETS_S))

    def count_prompt_sources(self, prompt_tokens: int, cached_tokens: int, external_tokens: int) -> None:
        """One request's prompt, split as vLLM splits it once the first token is out."""
        by_source = self.prompt_tokens_by_source
        by_source["local_compute"] += prompt_tokens - cached_tokens
        by_source["local_cache_hit"] += cached_tokens - external_tokens
        by_source["external_kv_transfer"] += external_tokens
