"""vLLM's block-hash recipe, against values a real vLLM 0.32 computed and published."""

from __future__ import annotations

import hashlib
import pickle

from kvgate.sim.vllm_block_hash import BlockDigests, block_digest, chain_digests, none_hash, published

# ``/tokenize`` of vLLM 0.32 serving a tiny Llama: 83 ids, whose two full 32-token blocks it published
# (BlockStored) as these two hashes.
PROMPT_IDS = [
    1, 432, 87, 433, 23, 442, 24, 442, 25, 442, 26, 442, 27, 442, 28, 442, 29, 442, 30, 442, 31, 442,
    32, 442, 2087, 442, 932, 442, 1633, 442, 2088, 442, 1634, 442, 1357, 442, 800, 442, 1117, 442, 1358,
    442, 983, 442, 1359, 442, 858, 442, 1203, 442, 859, 442, 822, 442, 823, 442, 890, 442, 984, 442, 1204,
    442, 745, 442, 2757, 442, 985, 442, 860, 442, 891, 442, 1205, 442, 746, 442, 1045, 442, 933, 442,
    1046, 442, 776,
]  # fmt: skip
PUBLISHED = [14311920008538701351, 9314865847160029789]


def test_the_none_hash_and_a_prompts_chain_are_vllms() -> None:
    assert none_hash().hex() == "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198"
    assert [published(d) for d in chain_digests(PROMPT_IDS, 32)] == PUBLISHED


def test_a_block_is_the_sha256_of_its_pickled_parent_tokens_and_no_extra_keys() -> None:
    parent = none_hash()
    pickled = pickle.dumps((parent, (1, 300, 70000), None), protocol=5)
    assert pickled.hex().startswith("8005")
    assert block_digest(parent, (1, 300, 70000)) == hashlib.sha256(pickled).digest()
    assert none_hash("123") == hashlib.sha256(pickle.dumps("123", protocol=5)).digest() != none_hash()


def test_digests_are_computed_once_per_block_from_the_nearest_known_ancestor() -> None:
    digests = BlockDigests()
    tokens = list(range(64))
    asked: list[int] = []

    def block_tokens(index: int) -> tuple[int, ...]:
        asked.append(index)
        return tuple(tokens[index * 16 : (index + 1) * 16])

    engine_hashes = [101, 102, 103, 104]
    expected = chain_digests(tokens, 16)
    parent, middle = digests.chain(engine_hashes, 2, 3, block_tokens)
    assert (parent, middle) == (expected[1], [expected[2]])
    assert asked == [0, 1, 2]
    parent, rest = digests.chain(engine_hashes, 3, 4, block_tokens)
    assert (parent, rest) == (expected[2], [expected[3]])
    assert asked == [0, 1, 2, 3]
    assert digests.chain(engine_hashes, 0, 2, block_tokens) == (None, expected[:2])
    assert asked == [0, 1, 2, 3]


def test_the_digest_cache_forgets_its_oldest_quarter_when_full() -> None:
    digests = BlockDigests(capacity_blocks=8)
    tokens = list(range(16 * 9))
    digests.chain(list(range(9)), 0, 9, lambda i: tuple(tokens[i * 16 : (i + 1) * 16]))
    assert len(digests) == 7
    again = digests.chain(list(range(9)), 8, 9, lambda i: tuple(tokens[i * 16 : (i + 1) * 16]))
    assert again[1] == chain_digests(tokens, 16)[8:]
