"""Scraping each replica's vLLM ``/metrics``: its own word on KV usage, queue and KV capacity.

Every ``interval_s`` all replicas are fetched concurrently with a short timeout, and the few gauges
routing needs are read into a ``ScrapedMetrics`` stamped with ``time.monotonic()`` (the clock the
gateway hands the routing core as ``now_s``). A failed fetch or an unreadable page leaves the
previous value in place: its age is what tells routing it is stale. The parser does not build
metric families: it finds the wanted sample lines with ``str.find`` and reads only those, because a
real vLLM page carries thousands of histogram lines the gateway never looks at. Data-parallel
engines on one replica (label ``engine``) are added up: requests and GPU blocks are summed, KV usage
is the block-weighted mean. vLLM v1 names come first; ``vllm:gpu_cache_usage_perc`` (vLLM v0) is
read when ``vllm:kv_cache_usage_perc`` is absent. A scrape carries the pool's ``api_key``.

Each scrape also tells the replica's KV capacity (``vllm:cache_config_info``: per engine its
``kv_cache_size_tokens`` label where vLLM reports one, as it does since vllm-project/vllm#42206 for
hybrid-attention models whose capacity is not ``num_gpu_blocks x block_size``, otherwise that
product; summed over engines), which ``ReplicaState.discover_capacity`` takes: it is the
capacity in use when the pool configures none (the replica is not routable before), and a
configured value that disagrees is warned about once per reported value. vLLM reports no
scheduler settings on ``/metrics``, so ``max_num_seqs`` stays the pool's ``max_sequences``.

A replica's first answered scrape also reads what it serves (``kvgate.gateway.replicas.model_facts``:
``/v1/models`` against the config, its block size against routing's), and the first round of
scrapes, the one at start-up, logs the fleet: each pool, its replicas, what each answered and its
KV capacity, and a warning when no replica answered at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from dataclasses import dataclass

import aiohttp

from kvgate.gateway.replicas.model_facts import ModelFacts
from kvgate.gateway.replicas.upstream import replica_headers
from kvgate.gateway.state import GatewayState, ReplicaState
from kvgate.vocabulary.clock import Clock
from kvgate.vocabulary.replica import ScrapedMetrics

KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_V0 = "vllm:gpu_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
CACHE_CONFIG = "vllm:cache_config_info"
METRICS_PATH = "/metrics"
log = logging.getLogger("kvgate.scrape")

_SAMPLE_LINE = re.compile(
    r"\n(vllm:(?:kv_cache_usage_perc|gpu_cache_usage_perc|num_requests_running|num_requests_waiting"
    r"|cache_config_info))"
    r'(?:\{((?:[^"}\n]++|"(?:[^"\\\n]++|\\.)*+")*+)\})?[ \t]+(\S+)'
)
"""A sample line of one wanted metric: name, label text (without braces), value. One pass in C: the
literal ``\nvllm:`` lets the regex engine skip the thousands of lines nobody asked for."""
_LABEL = re.compile(r'([A-Za-z_]\w*)\s*=\s*"((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class _Sample:
    labels: str
    value: float

    def label_values(self) -> dict[str, str]:
        return {str(key): str(value) for key, value in _LABEL.findall(self.labels)}


def parse_vllm_metrics(text: str, now_s: float) -> ScrapedMetrics | None:
    """The replica's gauges from a vLLM ``/metrics`` page, or None when the page lacks any of KV
    usage, running or waiting requests (then routing keeps to kvgate's own accounting)."""
    samples: dict[str, list[_Sample]] = {}
    for name, labels, raw_value in _SAMPLE_LINE.findall("\n" + text):
        try:
            value = float(raw_value)
        except ValueError:
            continue
        if math.isfinite(value) and value >= 0:
            samples.setdefault(name, []).append(_Sample(labels, value))
    usage = samples.get(KV_USAGE) or samples.get(KV_USAGE_V0)
    running = samples.get(RUNNING)
    waiting = samples.get(WAITING)
    if not (usage and running and waiting):
        return None
    blocks_by_engine: dict[str, int] = {}
    tokens_by_engine: dict[str, int] = {}
    block_size_tokens: int | None = None
    size_reported = False
    for sample in samples.get(CACHE_CONFIG, ()):
        labels = sample.label_values()
        blocks = _positive_int(labels.get("num_gpu_blocks"))
        size = _positive_int(labels.get("block_size"))
        if blocks is not None and size is not None:
            engine = labels.get("engine", "")
            blocks_by_engine[engine] = blocks
            block_size_tokens = size
            tokens = _positive_int(labels.get("kv_cache_size_tokens"))
            size_reported = size_reported or tokens is not None
            tokens_by_engine[engine] = tokens if tokens is not None else blocks * size
    num_gpu_blocks = sum(blocks_by_engine.values()) if blocks_by_engine else None
    return ScrapedMetrics(
        kv_cache_usage_ratio=_usage_ratio(usage, blocks_by_engine),
        num_requests_running=round(sum(s.value for s in running)),
        num_requests_waiting=round(sum(s.value for s in waiting)),
        num_gpu_blocks=num_gpu_blocks,
        block_size_tokens=block_size_tokens if num_gpu_blocks is not None else None,
        scraped_at_s=now_s,
        kv_cache_size_tokens=sum(tokens_by_engine.values()) if size_reported else None,
    )


def scraped_capacity_tokens(scraped: ScrapedMetrics | None) -> int | None:
    """The replica's true KV capacity, when its page told it: vLLM's ``kv_cache_size_tokens`` where
    it reports one, otherwise ``num_gpu_blocks * block_size``."""
    if scraped is None:
        return None
    if scraped.kv_cache_size_tokens is not None:
        return scraped.kv_cache_size_tokens
    if scraped.num_gpu_blocks is None or scraped.block_size_tokens is None:
        return None
    return scraped.num_gpu_blocks * scraped.block_size_tokens


def _usage_ratio(usage: list[_Sample], blocks_by_engine: dict[str, int]) -> float:
    """Mean KV usage over engines, weighted by each engine's blocks when every one is known."""
    if blocks_by_engine:
        weights = [blocks_by_engine.get(s.label_values().get("engine", ""), 0) for s in usage]
        if all(weights):
            return sum(s.value * w for s, w in zip(usage, weights, strict=True)) / sum(weights)
    return sum(s.value for s in usage) / len(usage)


def _positive_int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        return None
    return number if number > 0 else None


class Scraper:
    """Fetches every replica's ``/metrics`` every ``interval_s`` into ``ReplicaState.scraped``."""

    def __init__(
        self,
        state: GatewayState,
        session: aiohttp.ClientSession,
        interval_s: float,
        timeout_s: float | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self._state = state
        self._session = session
        self._interval_s = interval_s
        self._timeout = aiohttp.ClientTimeout(
            total=timeout_s if timeout_s is not None else min(1.0, interval_s)
        )
        self._clock = clock
        self._facts = ModelFacts(state, session, self._timeout)
        self._logged_start = False

    async def scrape_all(self) -> None:
        self._facts.forget_gone()
        replicas = list(self._state.replicas.values())
        answered = await asyncio.gather(*(self._scrape(r) for r in replicas))
        if not self._logged_start:
            self._logged_start = True
            log_fleet(self._state, {r.replica_id for r, ok in zip(replicas, answered, strict=True) if ok})

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self.scrape_all()

    async def _scrape(self, replica: ReplicaState) -> bool:
        """Whether the replica answered with a page the gateway reads."""
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, UnicodeDecodeError):
            async with self._session.get(
                replica.url + METRICS_PATH, headers=replica_headers(replica), timeout=self._timeout
            ) as response:
                if response.status != 200:
                    return False
                body = await response.read()
            scraped = parse_vllm_metrics(body.decode(), self._clock())
            if scraped is not None:
                replica.scraped = scraped
                if self._facts.pending(replica):
                    await self._facts.read(replica)
                self._facts.check_block_size(replica, scraped.block_size_tokens)
                if replica.discover_capacity(scraped_capacity_tokens(scraped)):
                    log.warning(
                        "replica %s (%s) of pool %s reports %d KV tokens (vllm:cache_config_info) but "
                        "the pool configures kv_capacity_tokens %d, which stays in use; remove it to "
                        "use each replica's own",
                        replica.url,
                        replica.name,
                        replica.pool,
                        replica.discovered_kv_capacity_tokens,
                        replica.configured_kv_capacity_tokens,
                    )
                return True
        return False


def log_fleet(state: GatewayState, answered: set[str]) -> None:
    """The start-up line of each pool (its replicas, whether each answered, its KV capacity in use
    and where that comes from, the models it serves), and a warning when none answered."""
    for pool in state.pools.values():
        members = [r for r in state.replicas.values() if r.pool == pool.name]
        source = (
            f"DNS {pool.dns.name}:{pool.dns.port}"
            if pool.dns is not None
            else "Kubernetes EndpointSlices"
            if pool.kubernetes is not None
            else "static"
        )
        described = [_described(r, r.replica_id in answered) for r in members] or ["none"]
        log.info(
            "pool %s (%s, %s): %d replica(s), %d answering, %d KV tokens discovered: %s",
            pool.name,
            pool.role,
            source,
            len(members),
            sum(1 for r in members if r.replica_id in answered),
            sum(r.kv_capacity_tokens for r in members if r.replica_id in answered),
            "; ".join(described),
        )
    if not answered:
        log.warning(
            "no replica answered at start-up (%d configured or discovered): /readyz answers 503 and "
            "requests get 503 until one does; check the pools' URLs, the replicas' ports and "
            "api_key",
            len(state.replicas),
        )


def _described(replica: ReplicaState, answered: bool) -> str:
    if not answered:
        return f"{replica.url} ({replica.name}) not answering"
    source = "configured" if replica.configured_kv_capacity_tokens is not None else "reported"
    models = ", ".join(sorted(replica.models)) or "no configured model"
    capacity = f"{replica.kv_capacity_tokens} KV tokens ({source})"
    return f"{replica.url} ({replica.name}) {capacity}, serves {models}"
