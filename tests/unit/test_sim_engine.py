"""The simulated engine on a manual clock: each vLLM mechanism shown as a relation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.sim.engine import Engine, EngineRequest
from kvgate.sim.kv_cache import BlockPool
from kvgate.sim.profile import PROFILES, resolve_profile
from kvgate.sim.sequence import natural_length_tokens


def _engine(**overrides: Any) -> Engine:
    return Engine(resolve_profile(overrides={"warmup_s": 0, **overrides}))


def _tokens(start: int, count: int) -> list[int]:
    return list(range(start, start + count))


def _run(engine: Engine, now_s: float = 0.0, max_steps: int = 100_000) -> float:
    """Step until idle; returns the simulated time at the end."""
    for _ in range(max_steps):
        if not engine.has_work:
            return now_s
        now_s = engine.step(now_s).end_s
    raise AssertionError("engine did not drain")


def _ttft_s(engine: Engine, prompt: Sequence[int], now_s: float = 0.0) -> float:
    request = engine.add_request(f"ttft-{now_s}-{len(prompt)}", prompt, 1, now_s)
    _run(engine, now_s)
    assert request.first_token_s is not None
    return request.first_token_s - now_s


def test_ttft_grows_with_prompt_length() -> None:
    ttfts = [_ttft_s(_engine(), _tokens(0, n)) for n in (64, 512, 2048, 8192, 20000)]
    assert ttfts == sorted(ttfts)
    assert len(set(ttfts)) == len(ttfts)


def _decode_step_s(batch: int, context_tokens: int) -> float:
    engine = _engine()
    for i in range(batch):
        engine.add_request(f"r{i}", _tokens(i * 100_000, context_tokens), 50, 0.0, ignore_eos=True)
    now_s = 0.0
    while True:
        result = engine.step(now_s)
        now_s = result.end_s
        if result.num_decode_seqs == batch:
            return result.duration_s


def test_itl_grows_with_batch_size_and_context() -> None:
    by_batch = [_decode_step_s(b, 1500) for b in (1, 8, 64, 128)]
    assert by_batch == sorted(by_batch) and by_batch[0] < by_batch[-1]
    by_context = [_decode_step_s(16, c) for c in (128, 1024, 8192)]
    assert by_context == sorted(by_context) and by_context[0] < by_context[-1]


def test_default_profile_lands_on_its_reference_figures() -> None:
    profile = PROFILES["llama-3.1-8b-h100"]
    assert 430_000 <= profile.kv_capacity_tokens <= 470_000
    assert profile.cold_start_s == 60.0
    assert 0.006 <= _decode_step_s(1, 1500) <= 0.007
    assert 0.010 <= _decode_step_s(64, 1500) <= 0.012
    prefill_rate = 4096 / _ttft_s(_engine(), _tokens(0, 4096))
    assert 25_000 <= prefill_rate <= 30_000


def test_shared_prefix_hits_the_cache_and_lowers_ttft() -> None:
    shared = _tokens(0, 4000)
    engine = _engine()
    _ttft_s(engine, [*shared, 1, 2, 3])
    hits_before = engine.stats.prefix_cache_hits_tokens
    warm = _ttft_s(engine, [*shared, 7, 8, 9], now_s=100.0)
    assert engine.stats.prefix_cache_hits_tokens - hits_before >= 3984
    cold = _ttft_s(engine, [*_tokens(50_000, 4000), 7, 8, 9], now_s=200.0)
    assert warm < cold / 4
    assert engine.stats.prefix_cache_queries_tokens == 3 * 4003


def test_idle_cached_blocks_count_as_free_yet_still_hit() -> None:
    engine = _engine(kv_capacity_tokens=4096)
    _ttft_s(engine, _tokens(0, 1000))
    assert engine.kv_cache_usage_ratio == 0.0
    _ttft_s(engine, _tokens(0, 1000), now_s=10.0)
    assert engine.stats.prefix_cache_hits_tokens == 992


def test_a_lookup_stops_at_the_first_missing_block() -> None:
    engine = _engine()
    _ttft_s(engine, _tokens(0, 320))
    changed = _tokens(0, 320)
    changed[40] = -1  # block 2 differs: blocks 0-1 hit, nothing after
    _ttft_s(engine, changed, now_s=10.0)
    assert engine.stats.prefix_cache_hits_tokens == 32


def test_overcommitted_kv_preempts_and_fills_the_cache() -> None:
    engine = _engine(kv_capacity_tokens=2048, max_num_seqs=16)
    requests = [
        engine.add_request(f"r{i}", _tokens(i * 1000, 200), 300, 0.0, ignore_eos=True) for i in range(8)
    ]
    now_s = 0.0
    peak_usage = 0.0
    while engine.has_work:
        now_s = engine.step(now_s).end_s
        peak_usage = max(peak_usage, engine.kv_cache_usage_ratio)
    assert engine.stats.num_preemptions > 0
    assert peak_usage >= 0.95
    assert all(r.num_output_tokens == 300 and r.finish_reason == "length" for r in requests)
    assert engine.pool.num_free_blocks == engine.pool.num_blocks


def test_first_schedule_counters_leave_out_the_prefill_again_after_preemption() -> None:
    engine = _engine(kv_capacity_tokens=2048, max_num_seqs=16)
    for i in range(8):
        engine.add_request(f"r{i}", _tokens(i * 1000, 200), 300, 0.0, ignore_eos=True)
    _run(engine)
    stats = engine.stats
    assert stats.num_preemptions > 0
    assert stats.first_schedule_queries_tokens == 8 * 200
    assert stats.first_schedule_hits_tokens == 0
    assert stats.prefix_cache_queries_tokens > stats.first_schedule_queries_tokens


def test_chunked_prefill_respects_the_token_budget() -> None:
    engine = _engine(max_num_batched_tokens=2048)
    request = engine.add_request("long", _tokens(0, 10_000), 5, 0.0)
    engine.add_request("short", _tokens(20_000, 100), 5, 0.0)
    now_s = 0.0
    steps = 0
    while request.first_token_s is None:
        result = engine.step(now_s)
        assert result.num_scheduled_tokens <= 2048
        now_s = result.end_s
        steps += 1
    assert steps == 5  # ceil(10000 / 2048)


def test_running_sequences_never_exceed_max_num_seqs() -> None:
    engine = _engine(max_num_seqs=4)
    for i in range(10):
        engine.add_request(f"r{i}", _tokens(i * 100, 50), 20, 0.0)
    now_s = 0.0
    while engine.has_work:
        now_s = engine.step(now_s).end_s
        assert engine.num_running <= 4


def test_most_requests_stop_before_a_generous_max_tokens() -> None:
    engine = _engine()
    requests = [engine.add_request(f"r{i}", _tokens(i, 20), 1000, 0.0) for i in range(200)]
    _run(engine)
    stopped = [r for r in requests if r.finish_reason == "stop"]
    assert len(stopped) > 150
    assert all(r.num_output_tokens < 1000 for r in stopped)
    assert len({r.num_output_tokens for r in requests}) > 50


def test_output_length_is_seeded_by_request_and_capped() -> None:
    profile = resolve_profile()
    assert natural_length_tokens(profile, 0, "a") == natural_length_tokens(profile, 0, "a")
    engine = _engine()
    capped = engine.add_request("a", _tokens(0, 10), 1, 0.0)
    forced = engine.add_request("b", _tokens(0, 10), 700, 0.0, ignore_eos=True)
    floor = engine.add_request("c", _tokens(0, 10), 5000, 0.0, min_tokens=4000)
    _run(engine)
    assert (capped.num_output_tokens, capped.finish_reason) == (1, "length")
    assert (forced.num_output_tokens, forced.finish_reason) == (700, "length")
    assert floor.num_output_tokens >= 4000


def test_abort_frees_blocks_and_counts_the_request() -> None:
    engine = _engine()
    request = engine.add_request("gone", _tokens(0, 500), 100, 0.0, ignore_eos=True)
    engine.step(0.0)
    assert engine.kv_cache_usage_ratio > 0
    engine.abort(request)
    assert engine.pool.num_free_blocks == engine.pool.num_blocks
    assert not engine.has_work
    assert engine.stats.request_success["abort"] == 1


def test_warm_up_slows_the_first_steps() -> None:
    profile = resolve_profile(overrides={"warmup_s": 10, "warmup_factor": 2})
    cold = Engine(profile, ready_s=0.0).step(0.0)
    warm = Engine(profile, ready_s=0.0)
    warm.add_request("w", _tokens(0, 100), 1, 20.0)
    cold_engine = Engine(profile, ready_s=0.0)
    cold_engine.add_request("c", _tokens(0, 100), 1, 0.0)
    assert cold.duration_s == 0.0
    assert cold_engine.step(0.0).duration_s == pytest.approx(2 * warm.step(20.0).duration_s)


def test_time_to_first_token_and_itl_are_recorded_in_simulated_seconds() -> None:
    engine = _engine()
    request = engine.add_request("r", _tokens(0, 1000), 10, 5.0, ignore_eos=True)
    end_s = _run(engine, 5.0)
    assert engine.stats.ttft_s.count == 1
    assert engine.stats.ttft_s.sum == pytest.approx((request.first_token_s or 0) - 5.0)
    assert engine.stats.itl_s.count == 9
    assert engine.stats.e2e_s.sum == pytest.approx(end_s - 5.0)
    assert engine.stats.generation_tokens == 10
    assert engine.stats.prompt_tokens == 1000


def test_unknown_or_bad_overrides_are_all_reported() -> None:
    with pytest.raises(ValueError, match="bogus") as info:
        resolve_profile(overrides={"bogus": 1, "max_num_seqs": 0, "kv_capacity_tokens": "x"})
    assert "max_num_seqs" in str(info.value) and "kv_capacity_tokens" in str(info.value)
    with pytest.raises(ValueError, match="unknown profile"):
        resolve_profile("gpt-5-on-a-toaster")
    assert resolve_profile("llama-3.1-70b-4xh100").kv_bytes_per_token == 327_680


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 300), st.integers(1, 60), st.integers(0, 3)), min_size=1, max_size=12),
    st.integers(40, 200),
)
def test_every_request_finishes_and_every_block_returns(
    specs: list[tuple[int, int, int]], capacity_blocks: int
) -> None:
    engine = _engine(kv_capacity_tokens=capacity_blocks * 16, max_num_seqs=6, max_num_batched_tokens=256)
    requests: list[EngineRequest] = []
    for i, (prompt_len, max_tokens, family) in enumerate(specs):
        prompt = [*_tokens(family * 10_000, min(prompt_len, 64)), *_tokens(i * 1000 + 500, prompt_len)][
            :prompt_len
        ]
        requests.append(engine.add_request(f"r{i}", prompt, max_tokens, float(i), ignore_eos=True))
    _run(engine)
    assert all(r.num_output_tokens == r.max_tokens for r in requests)
    assert engine.pool.num_free_blocks == engine.pool.num_blocks
    assert engine.stats.generation_tokens == sum(r.max_tokens for r in requests)


def test_block_pool_evicts_least_recently_freed_first() -> None:
    pool = BlockPool(4)
    first = pool.allocate(2)
    assert first is not None
    pool.register(first[0], 111)
    pool.free(first)
    assert pool.cached_prefix([111]) == [first[0]]
    assert pool.allocate(2) is not None  # the two never-used blocks
    assert pool.cached_prefix([111]) == [first[0]]
    assert pool.allocate(2) is not None  # now the freed ones, evicting the cached block
    assert pool.cached_prefix([111]) == []
    assert pool.allocate(1) is None
