"""Hashing a prompt run by run gives exactly the hashes of the whole prompt."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvgate.routing.prefix_hash import BlockHasher, block_hashes


@given(
    st.lists(st.lists(st.integers(0, 200_000), max_size=70), max_size=8),
    st.sampled_from([1, 4, 16]),
)
def test_runs_hash_as_the_whole_prompt(runs: list[list[int]], block_size: int) -> None:
    hasher = BlockHasher(block_size)
    for run in runs:
        hasher.add(run)
    assert hasher.hashes == block_hashes([i for run in runs for i in run], block_size)


def test_a_partial_block_waits_for_the_next_run() -> None:
    hasher = BlockHasher()
    hasher.add(list(range(20)))
    assert len(hasher.hashes) == 1
    hasher.add(list(range(20, 32)))
    assert hasher.hashes == block_hashes(list(range(32)))
