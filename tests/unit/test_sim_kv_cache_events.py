"""The KV cache events a simulated engine records, step by step on a manual clock, as vLLM 0.32
publishes them: when blocks are stored, what an eviction announces and where, and that the events,
applied in order, always equal the engine's real cache."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.routing.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
    KvEventBatch,
    decode_batch,
    encode_batch,
)
from kvgate.sim.engine import Engine, StepResult
from kvgate.sim.kv_cache import BlockPool
from kvgate.sim.profile import resolve_profile
from kvgate.sim.sequence import generated_token_id
from kvgate.sim.vllm_block_hash import BlockDigests, chain_digests, published

BLOCK = 16


def _engine(**overrides: Any) -> Engine:
    profile = resolve_profile(overrides={"warmup_s": 0, **overrides})
    return Engine(profile, digests=BlockDigests())


def _tokens(start: int, count: int) -> list[int]:
    return list(range(start, start + count))


def _recipe(token_ids: Sequence[int]) -> list[int]:
    return [published(d) for d in chain_digests(token_ids, BLOCK)]


def _step(engine: Engine, now_s: float) -> tuple[StepResult, float]:
    """One step, then the clock at its end (or at the next host load's end, if it ran nothing)."""
    result = engine.step(now_s)
    next_s = result.end_s
    if result.num_scheduled_tokens == 0 and engine.next_load_done_s is not None:
        next_s = max(next_s, engine.next_load_done_s)
    return result, next_s


def _drain(engine: Engine, now_s: float = 0.0) -> list[KvEvent]:
    events: list[KvEvent] = []
    for _ in range(100_000):
        if not engine.has_work:
            return events
        result, now_s = _step(engine, now_s)
        events.extend(result.kv_events)
    raise AssertionError("the engine did not drain")


def _stored(events: Sequence[KvEvent], medium: str = "GPU") -> list[BlockStored]:
    return [e for e in events if isinstance(e, BlockStored) and e.medium == medium]


def test_a_prompts_full_blocks_are_stored_at_once_chained_and_hashed_as_vllm_does() -> None:
    engine = _engine()
    prompt = _tokens(0, 83)
    engine.add_request("a", prompt, 1, 0.0)
    (first, _end) = _step(engine, 0.0)
    (stored,) = first.kv_events
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == tuple(_recipe(prompt))
    assert stored.parent_block_hash is None
    assert stored.token_ids == tuple(prompt[: 5 * BLOCK]) and stored.block_size == BLOCK
    assert stored.medium == "GPU"


def test_a_shared_prefix_stores_only_its_new_blocks_with_the_last_reused_one_as_parent() -> None:
    engine = _engine()
    shared = _tokens(0, 64)
    engine.add_request("a", [*shared, 1, 2], 1, 0.0)
    _drain(engine)
    longer = [*shared, *_tokens(9000, 40)]
    engine.add_request("b", longer, 1, 1.0)
    (stored,) = _stored(_drain(engine, 1.0))
    recipe = _recipe(longer)
    assert stored.block_hashes == tuple(recipe[4:])
    assert stored.parent_block_hash == recipe[3]
    assert stored.token_ids == tuple(longer[64:96])


def test_chunked_prefill_stores_each_chunks_blocks_in_its_own_step() -> None:
    engine = _engine(max_num_batched_tokens=64)
    prompt = _tokens(0, 200)
    engine.add_request("a", prompt, 1, 0.0)
    recipe = _recipe(prompt)
    per_step = [[e.block_hashes for e in _stored(batch)] for batch in _batches(engine)]
    assert per_step == [[tuple(recipe[0:4])], [tuple(recipe[4:8])], [tuple(recipe[8:12])], []]


def _batches(engine: Engine, now_s: float = 0.0) -> list[tuple[KvEvent, ...]]:
    out: list[tuple[KvEvent, ...]] = []
    while engine.has_work:
        result, now_s = _step(engine, now_s)
        out.append(result.kv_events)
    return out


def test_generated_blocks_are_stored_one_by_one_as_decoding_fills_them() -> None:
    """20 prompt tokens and 45 generated: the last one is sampled but never computed, so 64 tokens
    fill four blocks, the first at prefill and the others as decoding reaches 32, 48 and 64."""
    engine = _engine()
    prompt = _tokens(0, 20)
    engine.add_request("a", prompt, 45, 0.0, ignore_eos=True)
    stores = _stored(_drain(engine))
    text = [*prompt, *(generated_token_id(n) for n in range(45))]
    recipe = _recipe(text[:64])
    assert [s.block_hashes for s in stores] == [(h,) for h in recipe]
    assert [s.parent_block_hash for s in stores] == [None, *recipe[:3]]
    assert stores[1].token_ids == tuple(text[16:32])


def test_evictions_are_one_block_each_leaf_first_before_the_store_that_needed_the_room() -> None:
    engine = _engine(kv_capacity_tokens=8 * BLOCK)
    first = _tokens(0, 6 * BLOCK + 3)
    engine.add_request("a", first, 1, 0.0)
    _drain(engine)
    second = _tokens(5000, 6 * BLOCK + 3)
    engine.add_request("b", second, 1, 1.0)
    (batch,) = [b for b in _batches(engine, 1.0) if b]
    removed = [e for e in batch if isinstance(e, BlockRemoved)]
    assert all(len(e.block_hashes) == 1 for e in removed)
    # a's 7 blocks (6 full, cached) were freed tail first: the free queue hands out its 2 never-used
    # blocks, then a's blocks from the tail (the leaf) toward the root.
    assert [e.block_hashes[0] for e in removed] == _recipe(first)[::-1][:5]
    assert isinstance(batch[-1], BlockStored) and batch[-1].block_hashes == tuple(_recipe(second))


def test_a_recomputed_last_block_is_announced_again_and_each_copy_removed() -> None:
    """A 32-token prompt seen twice hits one block (a hit leaves a token to compute) and recomputes
    the second into a new block: vLLM caches and announces that copy too, and removes each copy."""
    engine = _engine(kv_capacity_tokens=4 * BLOCK)
    prompt = _tokens(0, 2 * BLOCK)
    engine.add_request("a", prompt, 1, 0.0)
    engine.add_request("b", prompt, 1, 0.0)
    events = _drain(engine)
    engine.add_request("c", _tokens(7000, 4 * BLOCK - 1), 1, 5.0)
    events += _drain(engine, 5.0)
    recipe = _recipe(prompt)
    announced = Counter(h for e in _stored(events) for h in e.block_hashes)
    assert announced[recipe[1]] == 2 and announced[recipe[0]] == 1
    removed = Counter(h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes)
    assert removed[recipe[1]] == 2
    assert _cache(engine) == _applied(events)


def test_a_reset_is_refused_while_blocks_are_held_and_announced_with_the_next_step() -> None:
    engine = _engine()
    engine.add_request("a", _tokens(0, 40), 5, 0.0, ignore_eos=True)
    _result, now_s = _step(engine, 0.0)
    assert not engine.reset_prefix_cache()
    _drain(engine, now_s)
    assert engine.reset_prefix_cache()
    assert engine.pool.cached_blocks() == []
    engine.add_request("b", _tokens(0, 40), 1, 10.0)
    first, _end = _step(engine, 10.0)
    assert isinstance(first.kv_events[0], AllBlocksCleared)
    assert _stored(first.kv_events)[0].parent_block_hash is None
    assert engine.stats.prefix_cache_hits_tokens == 0


def test_recording_events_changes_nothing_of_the_simulation() -> None:
    overrides = {"warmup_s": 0, "kv_capacity_tokens": 640, "max_num_seqs": 8, "cpu_offload_tokens": 800}
    profile = resolve_profile(overrides=overrides)
    plain, recorded = Engine(profile), Engine(profile, digests=BlockDigests())
    for engine in (plain, recorded):
        for i in range(12):
            prompt = [*_tokens(0, 50), *_tokens(1000 * (i % 3), 30 + i)]
            engine.add_request(f"r{i}", prompt, 80 + i, 0.0, ignore_eos=True)
    plain_steps, recorded_steps = _results(plain), _results(recorded)
    assert [_timing(r) for r in plain_steps] == [_timing(r) for r in recorded_steps]
    assert all(r.kv_events == () for r in plain_steps) and any(r.kv_events for r in recorded_steps)
    assert plain.stats.num_preemptions > 0 and plain.stats.external_prefix_cache_hits_tokens > 0


def _results(engine: Engine) -> list[StepResult]:
    out = []
    now_s = 0.0
    while engine.has_work:
        result, now_s = _step(engine, now_s)
        out.append(result)
    return out


def _timing(result: StepResult) -> tuple[float, int, int]:
    return (result.duration_s, result.num_scheduled_tokens, len(result.produced))


def _applied(events: Sequence[KvEvent], medium: str = "GPU") -> Counter[int]:
    """What a consumer holds after applying ``events`` in order: block hashes with their copies."""
    held: Counter[int] = Counter()
    for event in events:
        if isinstance(event, AllBlocksCleared):
            held.clear()
        elif event.medium != medium:
            continue
        elif isinstance(event, BlockStored):
            held.update(event.block_hashes)
        else:
            held.subtract(event.block_hashes)
    return +held


def _cache(engine: Engine) -> Counter[int]:
    assert engine.events is not None
    return Counter(engine.events.published_of(b) for b in engine.pool.cached_blocks())


@settings(max_examples=20, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 90), st.integers(1, 40), st.integers(0, 3)), max_size=25
    ),
    st.integers(12, 60),
    st.sampled_from([0, 24, 200]),
)
def test_the_events_applied_in_order_are_always_the_engines_cache(
    specs: list[tuple[int, int, int, int]], capacity_blocks: int, host_blocks: int
) -> None:
    engine = _engine(
        kv_capacity_tokens=capacity_blocks * BLOCK,
        cpu_offload_tokens=host_blocks * BLOCK,
        max_num_seqs=4,
        max_num_batched_tokens=128,
    )
    prefixes = [_tokens(family * 10_000, 20 + 37 * family) for family in range(4)]
    events: list[KvEvent] = []
    now_s = 0.0
    for i, (family, suffix, max_tokens, steps) in enumerate(specs):
        prompt = [*prefixes[family], *_tokens(100_000 + 1000 * i, suffix)][: capacity_blocks * BLOCK // 2]
        engine.add_request(f"r{i}", prompt, max_tokens, now_s, ignore_eos=True)
        for _ in range(steps):
            if not engine.has_work:
                break
            result, now_s = _step(engine, now_s)
            batch = decode_batch(encode_batch(KvEventBatch(now_s, result.kv_events))).events
            events.extend(batch)
            assert _applied(events) == _cache(engine)
            if engine.host is not None:
                assert _applied(events, "CPU") == Counter(engine.host.published_hashes())
    events += _drain(engine, now_s)
    assert _applied(events) == _cache(engine)
    assert engine.pool.num_free_blocks == engine.pool.num_blocks


def test_the_pool_keeps_every_copy_of_a_block_findable_until_the_last_is_evicted() -> None:
    pool = BlockPool(3, track_evictions=True)
    blocks = pool.allocate(3)
    assert blocks is not None
    pool.register(blocks[0], 7)
    pool.register(blocks[1], 7)
    pool.free(blocks)
    assert pool.cached_prefix([7]) == [blocks[0]]
    assert pool.allocate(1) == [blocks[2]]
    assert pool.allocate(1) == [blocks[1]] and pool.evicted == [blocks[1]]
    assert pool.cached_prefix([7]) == [blocks[0]]
    assert pool.allocate(1) == [blocks[0]] and pool.evicted == [blocks[1], blocks[0]]
    assert pool.cached_prefix([7]) == []
