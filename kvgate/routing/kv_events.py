"""vLLM's KV cache events, as values, and their wire format both ways.

A replica started with ``--kv-events-config`` publishes, over ZMQ PUB, one multipart message per
engine step that changed its prefix cache: ``[topic, seq, payload]``, ``seq`` an 8-byte big-endian
counter that starts at 0 when the replica starts (a gap is a dropped message), ``payload`` one
``KVEventBatch`` in msgpack: an array ``[ts, events, data_parallel_rank]`` whose events are maps
tagged by their first key, ``type``. ``BlockStored`` carries the new full blocks' hashes, the hash
of the block before the first (nil at the start of a prompt), their tokens and the block size;
``BlockRemoved`` the evicted blocks' hashes (one event per block, just before the ``BlockStored``
that needed the room); ``AllBlocksCleared`` that the whole cache was reset. ``medium`` says which
tier: ``GPU`` (vLLM says so on a CPU build too), ``CPU`` for a host-memory tier. The host tier's events
come from vLLM's offloading connector in its own form: a ``BlockStored`` with no tokens, no parent and
``block_size`` 0, a ``BlockRemoved`` of every block one store evicted, neither with ``group_idx``.

Hashes come as uint64 (vLLM's default) or as the raw digest (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``),
which reads as the same uint64 (its last eight bytes), so either matches the other. The decoder
takes what a real vLLM 0.32 publisher sends and skips what it does not know (a new event type, a
new field); ``encode_batch`` writes what that publisher writes, byte for byte, for the simulator.
Pure: values in, values out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

HASH_MASK = (1 << 64) - 1
GPU = "GPU"
CPU = "CPU"


class KvEventError(ValueError):
    """A payload that is not a ``KVEventBatch``."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    """Every stored block's tokens, concatenated: ``len(block_hashes) * block_size`` of them; none
    from the offloading connector (a host-tier store)."""
    block_size: int
    medium: str = GPU


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[int, ...]
    medium: str = GPU


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class KvEventBatch:
    ts: float
    events: tuple[KvEvent, ...]
    data_parallel_rank: int = 0


def block_hash(value: Any) -> int:
    """A published block hash as the uint64 vLLM sends by default, whichever form it came in."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value & HASH_MASK
    if isinstance(value, bytes) and value:
        return int.from_bytes(value[-8:], "big")
    raise KvEventError(f"a block hash must be an integer or bytes, got {type(value).__name__}")


def decode_batch(payload: bytes) -> KvEventBatch:
    """One message's payload; ``KvEventError`` when it is not a batch (an unknown event is skipped)."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise KvEventError(f"not msgpack: {exc}") from None
    if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
        raise KvEventError("not a [ts, events, ...] batch")
    ts, items = raw[0], raw[1]
    rank = raw[2] if len(raw) > 2 and isinstance(raw[2], int) else 0
    if not isinstance(ts, int | float):
        raise KvEventError("the batch's timestamp is not a number")
    events = tuple(event for item in items if (event := _event(item)) is not None)
    return KvEventBatch(float(ts), events, rank)


def _event(item: Any) -> KvEvent | None:
    if not isinstance(item, dict):
        raise KvEventError("an event is not a map")
    kind = item.get("type")
    if kind == "BlockStored":
        hashes = _hashes(item.get("block_hashes"))
        parent = item.get("parent_block_hash")
        tokens = item.get("token_ids")
        size = item.get("block_size")
        if not isinstance(tokens, list) or not isinstance(size, int) or size < 0:
            raise KvEventError("BlockStored without token_ids or block_size")
        if tokens and len(tokens) != len(hashes) * size:
            raise KvEventError(f"BlockStored: {len(tokens)} tokens for {len(hashes)} blocks of {size}")
        return BlockStored(
            hashes,
            None if parent is None else block_hash(parent),
            tuple(tokens),
            size,
            _medium(item),
        )
    if kind == "BlockRemoved":
        return BlockRemoved(_hashes(item.get("block_hashes")), _medium(item))
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def _hashes(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise KvEventError("block_hashes is not a list")
    return tuple(block_hash(h) for h in value)


def _medium(item: dict[str, Any]) -> str:
    medium = item.get("medium")
    return medium if isinstance(medium, str) else GPU


def encode_batch(batch: KvEventBatch) -> bytes:
    """The payload a vLLM 0.32 publisher writes for ``batch`` (no LoRA, no cache salt, one KV group); a
    ``BlockStored`` without tokens, and a ``BlockRemoved`` off the GPU, in the offloading connector's form."""
    payload: bytes = msgpack.packb([batch.ts, [_encoded(e) for e in batch.events], batch.data_parallel_rank])
    return payload


def _encoded(event: KvEvent) -> dict[str, Any]:
    if isinstance(event, BlockStored) and not event.token_ids:
        return {
            "type": "BlockStored",
            "block_hashes": list(event.block_hashes),
            "parent_block_hash": event.parent_block_hash,
            "token_ids": [],
            "block_size": event.block_size,
            "lora_id": None,
            "medium": event.medium,
            "lora_name": None,
        }
    if isinstance(event, BlockStored):
        return {
            "type": "BlockStored",
            "block_hashes": list(event.block_hashes),
            "parent_block_hash": event.parent_block_hash,
            "token_ids": list(event.token_ids),
            "block_size": event.block_size,
            "lora_id": None,
            "medium": event.medium,
            "lora_name": None,
            "extra_keys": [None] * len(event.block_hashes),
            "group_idx": 0,
            "kv_cache_spec_kind": "full_attention",
        }
    if isinstance(event, BlockRemoved):
        hashes = list(event.block_hashes)
        if event.medium != GPU:
            return {"type": "BlockRemoved", "block_hashes": hashes, "medium": event.medium}
        return {"type": "BlockRemoved", "block_hashes": hashes, "medium": event.medium, "group_idx": 0}
    return {"type": "AllBlocksCleared"}


def sequence_number(frame: bytes) -> int:
    """The message's ``seq`` frame: 8 bytes, big-endian."""
    if len(frame) != 8:
        raise KvEventError(f"a sequence frame has 8 bytes, got {len(frame)}")
    return int.from_bytes(frame, "big")


def removed(hashes: Iterable[int], medium: str = GPU) -> tuple[BlockRemoved, ...]:
    """One ``BlockRemoved`` per block, as vLLM sends evictions."""
    return tuple(BlockRemoved((h,), medium) for h in hashes)


def stored_blocks(event: BlockStored) -> Sequence[tuple[int, tuple[int, ...]]]:
    """Each stored block's hash with its own tokens, in chain order."""
    size = event.block_size
    tokens = event.token_ids
    return [(h, tokens[i * size : (i + 1) * size]) for i, h in enumerate(event.block_hashes)]
