"""The index fed by replicas' KV events: what each cache holds, per tier, evictions included."""

from __future__ import annotations

from kvgate.routing.cache_index import CacheIndex, Match
from kvgate.routing.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from kvgate.routing.prefix_hash import block_hashes

SIZE = 4


def prompt(*blocks: int) -> list[int]:
    """Token ids: block ``b`` is four tokens ``b*10 .. b*10+3``."""
    return [b * 10 + i for b in blocks for i in range(SIZE)]


def stored(
    token_ids: list[int], vllm_hashes: list[int], parent: int | None = None, medium: str = "GPU"
) -> BlockStored:
    return BlockStored(tuple(vllm_hashes), parent, tuple(token_ids), SIZE, medium)


def index(*replicas: str) -> CacheIndex:
    cache = CacheIndex(SIZE, speculation_s=2.0)
    for replica in replicas:
        cache.start(replica)
    return cache


def test_stored_blocks_match_a_prompt_hashed_by_the_gateway_whatever_vllms_hashes_are() -> None:
    cache = index("a", "b")
    assert cache.apply("a", stored(prompt(1, 2), [901, 902])).stored == 2
    cache.apply("a", stored(prompt(3), [903], parent=902))
    hashes = block_hashes(prompt(1, 2, 3, 4), SIZE)
    assert cache.match("a", hashes, 0.0) == Match(3, 0)
    assert cache.match("b", hashes, 0.0) == Match(0, 0)
    assert cache.match("a", block_hashes(prompt(1, 5), SIZE), 0.0) == Match(1, 0)
    assert cache.follows("a") and not cache.follows("c")


def test_an_eviction_and_a_reset_take_blocks_away() -> None:
    cache = index("a")
    cache.apply("a", stored(prompt(1, 2, 3), [901, 902, 903]))
    hashes = block_hashes(prompt(1, 2, 3), SIZE)
    assert cache.apply("a", BlockRemoved((903,))).removed == 1
    assert cache.match("a", hashes, 0.0) == Match(2, 0)
    assert cache.apply("a", BlockRemoved((903,))).removed == 0, "already gone"
    assert cache.apply("a", AllBlocksCleared()).cleared
    assert cache.match("a", hashes, 0.0) == Match(0, 0)
    assert cache.held_blocks("a") == 0


def test_a_block_whose_parent_is_unknown_or_of_another_size_is_left_out() -> None:
    cache = index("a")
    assert cache.apply("a", stored(prompt(2), [902], parent=901)).unlinked == 1
    other = BlockStored((1,), None, tuple(range(8)), 8, "GPU")
    assert cache.apply("a", other).unlinked == 1
    assert cache.held_blocks("a") == 0


def test_the_host_tier_continues_a_gpu_match_and_an_offloaded_block_survives_gpu_eviction() -> None:
    cache = index("a")
    cache.apply("a", stored(prompt(1, 2, 3), [901, 902, 903]))
    cache.apply("a", stored(prompt(1, 2, 3), [901, 902, 903], medium="CPU"))
    cache.apply("a", BlockRemoved((902,)))
    cache.apply("a", BlockRemoved((903,)))
    hashes = block_hashes(prompt(1, 2, 3, 4), SIZE)
    assert cache.match("a", hashes, 0.0) == Match(1, 2)
    cache.apply("a", stored(prompt(4), [904], parent=903, medium="CPU"))
    assert cache.match("a", hashes, 0.0) == Match(1, 3), "the parent is known from the host tier"
    assert (cache.held_blocks("a"), cache.held_blocks("a", "CPU")) == (1, 4)


def test_a_speculative_entry_holds_until_its_events_come_or_it_lapses() -> None:
    cache = index("a", "b")
    hashes = block_hashes(prompt(1, 2), SIZE)
    cache.speculate("a", hashes, now_s=10.0)
    assert cache.match("a", hashes, 11.0) == Match(2, 0)
    assert cache.match("a", hashes, 12.0) == Match(0, 0), "lapsed after speculation_s"
    cache.speculate("b", hashes, now_s=20.0)
    cache.apply("b", stored(prompt(1, 2), [901, 902]))
    cache.speculate("a", hashes[:1], now_s=30.0)
    assert cache.match("b", hashes, 25.0) == Match(2, 0), "the events made it real"
    cache.speculate("nobody", hashes, now_s=1.0)
    assert not cache.follows("nobody")
