"""The host-memory tier (vLLM's native KV offloading) on a manual clock: what it holds, what a hit
costs, how vLLM counts it, and what it announces."""

from __future__ import annotations

from typing import Any

import pytest

from kvgate.routing.kv_events import BlockRemoved, BlockStored, KvEvent
from kvgate.sim.engine import Engine, EngineRequest
from kvgate.sim.host_tier import HostStore, HostTier
from kvgate.sim.profile import resolve_profile
from kvgate.sim.vllm_block_hash import BlockDigests, chain_digests, published

BLOCK = 16
PROMPT = list(range(4000))


def _engine(**overrides: Any) -> Engine:
    settings = {"warmup_s": 0, "kv_capacity_tokens": 6000, "cpu_offload_tokens": 40_000, **overrides}
    return Engine(resolve_profile(overrides=settings), digests=BlockDigests())


def _run(engine: Engine, now_s: float) -> tuple[float, list[KvEvent]]:
    events: list[KvEvent] = []
    for _ in range(100_000):
        if not engine.has_work:
            return now_s, events
        result = engine.step(now_s)
        events.extend(result.kv_events)
        now_s = result.end_s
        if result.num_scheduled_tokens == 0 and engine.next_load_done_s is not None:
            now_s = max(now_s, engine.next_load_done_s)
    raise AssertionError("the engine did not drain")


def _ttft_s(engine: Engine, prompt: list[int], now_s: float) -> tuple[float, EngineRequest, list[KvEvent]]:
    request = engine.add_request(f"at-{now_s}", prompt, 1, now_s)
    _end, events = _run(engine, now_s)
    assert request.first_token_s is not None
    return request.first_token_s - now_s, request, events


def _evict_from_the_gpu(engine: Engine, now_s: float) -> float:
    """Other prompts, enough to push every block of ``PROMPT`` out of the GPU cache."""
    for i in range(engine.profile.kv_capacity_tokens // 3000 + 1):
        engine.add_request(f"other{i}", list(range(100_000 * (i + 1), 100_000 * (i + 1) + 3000)), 1, now_s)
    end_s, _events = _run(engine, now_s)
    assert engine.pool.cached_prefix(engine.add_request("probe", PROMPT, 1, 0.0).prompt_hashes[:1]) == []
    engine.abort_all()
    return end_s


def test_a_prefix_found_only_in_host_memory_loads_faster_than_recompute_slower_than_a_gpu_hit() -> None:
    suffix = [*PROMPT, 7, 8, 9]
    cold_s, _r, _e = _ttft_s(_engine(cpu_offload_tokens=0), suffix, 0.0)

    gpu = _engine()
    _ttft_s(gpu, PROMPT, 0.0)
    gpu_hit_s, _r, _e = _ttft_s(gpu, suffix, 100.0)

    host = _engine()
    _ttft_s(host, PROMPT, 0.0)
    now_s = _evict_from_the_gpu(host, 100.0)
    host_hit_s, request, _events = _ttft_s(host, suffix, now_s + 100.0)

    assert gpu_hit_s < host_hit_s < cold_s
    assert request.num_cached_tokens == request.num_external_tokens == 4000
    load_s = 4000 * host.profile.kv_bytes_per_token / host.profile.cpu_offload_bytes_per_s
    assert host_hit_s == pytest.approx(load_s + gpu_hit_s, rel=0.05)


def test_host_hits_are_external_hits_and_their_own_source_as_vllm_counts_them() -> None:
    engine = _engine()
    _ttft_s(engine, PROMPT, 0.0)
    now_s = _evict_from_the_gpu(engine, 100.0)
    stats = engine.stats
    before = (stats.prefix_cache_queries_tokens, stats.prefix_cache_hits_tokens)
    _ttft_s(engine, [*PROMPT, 1], now_s + 100.0)
    assert stats.prefix_cache_queries_tokens - before[0] == 4001
    assert stats.prefix_cache_hits_tokens == before[1], "a host hit is no GPU prefix-cache hit"
    assert stats.external_prefix_cache_hits_tokens == 4000
    assert stats.cached_tokens_by_source["host"] == 4000
    assert stats.prompt_tokens_by_source["external_kv_transfer"] == 4000
    assert stats.prompt_tokens_by_source["local_compute"] == stats.prompt_tokens - 4000


def test_every_computed_block_is_copied_to_the_host_and_announced_there_without_tokens() -> None:
    engine = _engine(cpu_offload_tokens=4 * BLOCK)
    first, second = list(range(50)), list(range(1000, 1050))
    _t, _r, events = _ttft_s(engine, first, 0.0)
    gpu_store, host_store = events
    assert isinstance(gpu_store, BlockStored) and isinstance(host_store, BlockStored)
    assert host_store == BlockStored(gpu_store.block_hashes, None, (), 0, "CPU")
    _t, _r, events = _ttft_s(engine, second, 10.0)
    assert [type(e).__name__ + getattr(e, "medium", "") for e in events] == [
        "BlockStoredGPU",
        "BlockRemovedCPU",
        "BlockStoredCPU",
    ]
    (evicted,) = [e for e in events if isinstance(e, BlockRemoved)]
    assert evicted.block_hashes == tuple(published(d) for d in chain_digests(first, BLOCK)[:2])


def test_a_request_loading_its_prefix_waits_while_others_run_and_a_block_loads_once() -> None:
    engine = _engine(kv_capacity_tokens=12_000)
    _ttft_s(engine, PROMPT, 0.0)
    now_s = _evict_from_the_gpu(engine, 100.0)
    a = engine.add_request("a", [*PROMPT, 1], 1, now_s)
    b = engine.add_request("b", [*PROMPT, 2], 1, now_s)
    engine.add_request("other", list(range(900_000, 900_200)), 1, now_s)
    first = engine.step(now_s)
    assert [r.request_id for r in first.produced] == ["other"]
    assert engine.num_waiting == 2 and engine.next_load_done_s is not None
    _run(engine, first.end_s)
    assert a.first_token_s is not None and b.first_token_s is not None
    assert (a.num_cached_tokens, a.num_external_tokens) == (4000, 4000)
    assert (b.num_cached_tokens, b.num_external_tokens) == (4000, 0), "b found a's loaded blocks"
    assert engine.stats.external_prefix_cache_hits_tokens == 4000


def test_the_tier_evicts_least_recently_used_never_what_it_is_storing() -> None:
    tier = HostTier(3)
    assert tier.store([1, 2], [11, 12]) == HostStore((11, 12), ())
    assert tier.store([2, 3], [12, 13]) == HostStore((13,), ())
    assert tier.cached_prefix([1, 9]) == 1  # 1 is now the most recent
    assert tier.store([2, 4], [12, 14]) == HostStore((14,), (13,))
    assert sorted(tier.published_hashes()) == [11, 12, 14]
    assert tier.store([5, 6, 7, 8], [15, 16, 17, 18]) == HostStore((), ())
    assert tier.store([1, 2, 4, 5], [11, 12, 14, 15]) == HostStore((), ()), "no room beside what it keeps"


def test_an_idle_engine_whose_only_request_loads_its_prefix_names_when_to_step_again() -> None:
    engine = _engine()
    _ttft_s(engine, PROMPT, 0.0)
    now_s = _evict_from_the_gpu(engine, 100.0)
    request = engine.add_request("late", [*PROMPT, 1], 1, now_s + 100.0)

    idle = engine.step(now_s + 100.0)

    assert idle.num_scheduled_tokens == 0 and idle.duration_s == 0.0
    assert engine.has_work and engine.num_waiting == 1 and engine.num_running == 0
    load_done_s = engine.next_load_done_s
    load_s = 4000 * engine.profile.kv_bytes_per_token / engine.profile.cpu_offload_bytes_per_s
    assert load_done_s == pytest.approx(now_s + 100.0 + load_s)
    assert engine.step(load_done_s).produced == (request,)
