from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.routing.prefix_hash import block_hashes
from kvgate.routing.prefix_index import PrefixIndex


def chain(prefix: int, blocks: int) -> list[int]:
    """Block hashes of a prompt whose first blocks are shared by every prompt with the same prefix."""
    return block_hashes([prefix] * 16 + list(range(16 * (blocks - 1))))


def linear_match(index: PrefixIndex, replica_id: str, hashes: list[int]) -> int:
    for i, h in enumerate(hashes):
        if not index.holds(replica_id, h):
            return i
    return len(hashes)


def test_match_stops_at_first_miss() -> None:
    index = PrefixIndex(capacity_blocks=100)
    system = block_hashes(list(range(64)))
    index.record("a", system)
    other_user = block_hashes([*range(64), *range(1000, 1032)])
    assert index.match_blocks("a", other_user) == 4
    assert index.match_blocks("a", block_hashes(list(range(1, 65)))) == 0
    assert index.match_blocks("b", system) == 0
    assert index.match_blocks("a", []) == 0


def test_reused_prompts_survive_and_unused_ones_are_forgotten() -> None:
    index = PrefixIndex(capacity_blocks=8)
    reused, unused = chain(1, 4), chain(2, 4)
    index.record("a", reused)
    index.record("a", unused)
    assert index.size_blocks("a") == 8
    index.record("a", reused)
    index.record("a", chain(3, 2))
    assert index.match_blocks("a", reused) == 4
    assert index.match_blocks("a", chain(3, 2)) == 2
    assert index.match_blocks("a", unused) == 0
    assert index.longest_holders(unused) == (0, ())


def test_a_chain_longer_than_capacity_keeps_its_head() -> None:
    index = PrefixIndex(capacity_blocks=8)
    long_chain = chain(5, 20)
    index.record("a", long_chain)
    assert index.size_blocks("a") == 8
    assert index.match_blocks("a", long_chain) == 8


def test_longest_holders_and_remove_replica() -> None:
    index = PrefixIndex(capacity_blocks=100)
    hashes = chain(7, 6)
    index.record("a", hashes[:3])
    index.record("b", hashes)
    index.record("c", hashes)
    depth, holders = index.longest_holders(hashes)
    assert depth == 6 and sorted(holders) == ["b", "c"]
    index.remove_replica("b")
    index.remove_replica("c")
    assert index.longest_holders(hashes) == (3, ("a",))
    index.remove_replica("a")
    assert index.longest_holders(hashes) == (0, ())
    assert index.replica_ids == frozenset()


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 5), st.integers(1, 6)),
        min_size=1,
        max_size=40,
    ),
    capacity=st.integers(1, 12),
)
def test_sets_stay_prefix_closed_so_binary_search_equals_a_walk(
    ops: list[tuple[str, int, int]], capacity: int
) -> None:
    index = PrefixIndex(capacity_blocks=capacity)
    for replica_id, prefix, blocks in ops:
        index.record(replica_id, chain(prefix, blocks))
        assert index.size_blocks(replica_id) <= capacity
    for replica_id in ("a", "b"):
        for prefix in range(6):
            hashes = chain(prefix, 6)
            assert index.match_blocks(replica_id, hashes) == linear_match(index, replica_id, hashes)
            present = [index.holds(replica_id, h) for h in hashes]
            assert present == sorted(present, reverse=True)


def test_match_each_agrees_with_match_blocks_for_holders_and_strangers() -> None:
    index = PrefixIndex(capacity_blocks=100)
    hashes = chain(9, 6)
    replicas = ["a", "b", "c", "d"]
    assert index.match_each(replicas, hashes) == [0, 0, 0, 0]
    index.record("b", hashes[:2])
    assert index.match_each(replicas, hashes) == [0, 2, 0, 0]
    index.record("d", hashes)
    index.record("a", chain(10, 3))
    assert (
        index.match_each(replicas, hashes)
        == [index.match_blocks(r, hashes) for r in replicas]
        == [0, 2, 0, 6]
    )
    assert index.match_each(replicas, []) == [0, 0, 0, 0]
    assert index.longest_blocks(hashes) == 6


def test_record_says_how_many_blocks_the_replica_writes() -> None:
    index = PrefixIndex(capacity_blocks=100)
    assert index.record("a", chain(1, 6)) == 6
    assert index.record("a", chain(1, 9)) == 3
    assert index.record("a", chain(1, 9)) == 0


def test_output_blocks_written_elsewhere_turn_a_prefix_over() -> None:
    """A replica evicts cached prefixes to make room for any new block, output included: after more
    than a generation (half the capacity) of writes since a prefix was last routed, and another
    generation after that, it is forgotten even though no other prompt took its place."""
    index = PrefixIndex(capacity_blocks=100)
    prefix = chain(1, 4)
    index.record("a", prefix)
    index.record("a", chain(2, 1), output_blocks=49)
    assert index.match_blocks("a", prefix) == 4
    index.record("a", chain(3, 1), output_blocks=60)
    assert index.match_blocks("a", prefix) == 0
    assert index.longest_holders(prefix) == (0, ())


def test_a_replica_with_a_smaller_cache_forgets_sooner() -> None:
    index = PrefixIndex(capacity_blocks=100)
    for replica_id in ("small", "large"):
        index.record(replica_id, chain(1, 4), capacity_blocks=20 if replica_id == "small" else 0)
        for prefix in range(2, 8):
            index.record(replica_id, chain(prefix, 4), capacity_blocks=20 if replica_id == "small" else 0)
    assert index.match_blocks("small", chain(1, 4)) == 0
    assert index.match_blocks("large", chain(1, 4)) == 4
    assert index.size_blocks("small") <= 20


def test_a_cache_larger_than_the_index_bound_counts_as_the_bound() -> None:
    index = PrefixIndex(capacity_blocks=8)
    index.record("a", chain(5, 20), capacity_blocks=1_000)
    assert index.size_blocks("a") == 8
