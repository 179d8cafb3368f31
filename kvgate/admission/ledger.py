"""Reservations: the worst-case work kvgate has sent to each replica and not yet seen finish.

An admitted request reserves ``prompt + max_output`` KV tokens on one replica, ``max_output`` being
every token all its sequences may generate. Until its first token it also counts its prompt as
pending prefill work; afterwards its sequences (``n`` of them for a request with ``n`` choices) are
resident, with ``max_output - produced`` decode work remaining. The reservation ends exactly once, whatever
ends the request (completion, error, client disconnect, replica death, or an expired lease): every
mutator is idempotent and answers whether it changed anything, so duplicate or out-of-order events
(a late token count after release, a second release) leave the totals alone. Invariant: with no
reservation held every total is zero.

The ``Ledger`` Protocol is the seam for a shared ledger (several gateway processes): each
reservation carries a lease that its holder renews, and ``expire`` drops reservations whose holder
stopped renewing, so a crashed gateway's reservations do not leak capacity forever.

Prompt blocks are counted once per replica, as vLLM's prefix cache holds them: a reservation may
name its prompt's chained block hashes, and a replica's *shared* blocks are those some reservation
there has computed (its first token was seen, so its prompt's full blocks are in the replica's
cache). A new reservation is not charged for the leading blocks of its prompt that are shared (it
will hit them), and holds them while it lives; the rest of its prompt it computes itself, so it is
charged for it, and once its first token is seen its blocks not yet shared become shared (a block
someone else computed meanwhile stays its own copy, as vLLM's does). So a replica's reserved KV is
every shared block once plus, per reservation, its worst case beyond the shared blocks it holds;
blocks are reference-counted, so the last reservation holding a shared block takes it with it. The
ledger answers ``shared_tokens`` (``kvgate.vocabulary.sharing.ResidentPrefixes``) for the room checks.
Two requests that arrive together with one new system prompt are both charged for it, as both
compute it: a block is never counted shared before it exists.

Such a block may then have two copies on the replica, and the one its prefix cache hands to later
prompts is the one computed first: the copy of the request that reached the replica first, not of
the one whose first token the gateway happened to read first (two streams' first tokens of one step
arrive in either order). A reservation whose copy may be that one (it was reserved no later than the
reservation that made the block shared) leaves it counted when it ends, for as long as the block
stays shared: the copy is free to the replica but still cached, and the next prompt to hit the block
takes it back out of the free blocks without being charged for it. At most one such copy per block
is counted, as a prefix cache hands out one copy of a block at a time, and it goes with the block.

Everything is counted in whole KV blocks of ``block_tokens``, as vLLM allocates them: a reservation
is charged its worst case rounded up to whole blocks (a sequence's last block is allocated whole
however few tokens it holds), and a prompt is credited only the shared blocks the replica's prefix
cache will give it (never the block holding its last token, which vLLM computes again to produce
the first token, so a prompt of exactly 32 tokens can hit one block, not two). With the replica's
capacity in whole blocks, a request fits by tokens exactly when it fits by blocks, so what the
ledger lets fit the replica never needs more blocks than the replica has (a request of ``n``
sequences is rounded as a whole, not per sequence).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Protocol

from kvgate.admission.cost import CostEstimate
from kvgate.vocabulary.replica import ReplicaLoad
from kvgate.vocabulary.value import frozen_value


@frozen_value
class Reservation:
    request_id: str
    replica_id: str
    cost: CostEstimate
    reserved_at_s: float
    lease_expires_at_s: float
    first_token_seen: bool = False
    produced_tokens: int = 0
    cached_prompt_tokens: int = 0
    """Prompt tokens the replica's prefix cache was expected to serve when the request was routed."""

    @property
    def pending_prompt_tokens(self) -> int:
        return 0 if self.first_token_seen else self.cost.prompt_tokens

    @property
    def pending_uncached_tokens(self) -> int:
        return 0 if self.first_token_seen else self.cost.prompt_tokens - self.cached_prompt_tokens

    @property
    def remaining_decode_tokens(self) -> int:
        return self.cost.max_output_tokens - self.produced_tokens

    @property
    def kv_tokens(self) -> int:
        return self.cost.kv_tokens


class Ledger(Protocol):
    def reserve(
        self,
        request_id: str,
        replica_id: str,
        cost: CostEstimate,
        now_s: float,
        block_hashes: Sequence[int] = (),
        cached_prompt_tokens: int = 0,
    ) -> bool:
        """Hold ``cost`` on ``replica_id``, its prompt blocks ``block_hashes`` shared with the other
        reservations there, ``cached_prompt_tokens`` of its prompt expected from the replica's prefix
        cache (pending prefill work only counts the rest); False (nothing changes) if ``request_id``
        already holds one."""
        ...

    def shared_tokens(self, replica_id: str, block_hashes: Sequence[int], prompt_tokens: int) -> int: ...

    def first_token(self, request_id: str) -> bool:
        """Prefill done: its prompt no longer counts as pending prefill."""
        ...

    def produced(self, request_id: str, produced_tokens: int) -> bool:
        """``produced_tokens`` is the running total generated so far (not an increment), so a
        repeated or reordered report cannot double-count; it implies the first token."""
        ...

    def release(self, request_id: str) -> bool:
        """End the reservation; True only for the call that ended it."""
        ...

    def renew(self, request_id: str, now_s: float) -> bool: ...

    def expire(self, now_s: float) -> list[Reservation]:
        """Release every reservation whose lease ran out by ``now_s``; returns them."""
        ...

    def release_replica(self, replica_id: str) -> list[Reservation]:
        """The replica died: release everything held on it; returns what was released."""
        ...

    def get(self, request_id: str) -> Reservation | None: ...

    def resident(self, replica_id: str) -> list[Reservation]: ...

    def load(self, replica_id: str) -> ReplicaLoad: ...

    def totals(self) -> ReplicaLoad: ...


class InMemoryLedger:
    """One process's ledger. Aggregates per replica are kept incrementally: ``load`` is O(1)."""

    def __init__(self, lease_s: float = 600.0, block_tokens: int = 16) -> None:
        if lease_s <= 0:
            raise ValueError(f"lease_s must be > 0 seconds, got {lease_s}")
        self.lease_s = lease_s
        self.block_tokens = block_tokens
        self._held: dict[str, Reservation] = {}
        self._by_replica: dict[str, dict[str, Reservation]] = {}
        self._loads: dict[str, ReplicaLoad] = {}
        self._leases: list[tuple[float, str]] = []
        self._blocks: dict[str, Counter[int]] = {}
        """Per replica, the shared (computed) prompt blocks and how many reservations hold each."""
        self._prompts: dict[str, Sequence[int]] = {}
        """Each reservation's prompt blocks until its first token, when it named them."""
        self._holds: dict[str, list[int]] = {}
        """The shared blocks each reservation holds (and is not charged for on its own)."""
        self._shared_by: dict[str, dict[int, float]] = {}
        """Per replica, when the reservation that made each shared block shared was reserved."""
        self._copies: dict[str, list[int]] = {}
        """Each reservation's own copies of shared blocks that its replica may hand out for them."""
        self._orphans: dict[str, set[int]] = {}
        """Per replica, shared blocks with a copy whose reservation ended: counted until the block is
        no longer shared, as a prompt hitting the block may be given that copy."""

    def reserve(
        self,
        request_id: str,
        replica_id: str,
        cost: CostEstimate,
        now_s: float,
        block_hashes: Sequence[int] = (),
        cached_prompt_tokens: int = 0,
    ) -> bool:
        if request_id in self._held:
            return False
        cached = min(max(0, cached_prompt_tokens), cost.prompt_tokens)
        held = Reservation(
            request_id, replica_id, cost, now_s, now_s + self.lease_s, cached_prompt_tokens=cached
        )
        self._put(held)
        kv_tokens = self.kv_block_tokens(cost)
        if block_hashes:
            shared = self.shared_tokens(replica_id, block_hashes, cost.prompt_tokens) // self.block_tokens
            if shared:
                blocks = self._blocks[replica_id]
                held_blocks = list(block_hashes[:shared])
                for block in held_blocks:
                    blocks[block] += 1
                self._holds[request_id] = held_blocks
                kv_tokens -= shared * self.block_tokens
            if shared < len(block_hashes):
                self._prompts[request_id] = block_hashes
        self._shift(
            replica_id,
            cost.prompt_tokens,
            cost.sequences,
            cost.max_output_tokens,
            kv_tokens,
            held.pending_uncached_tokens,
        )
        self._push_lease(held)
        return True

    def kv_block_tokens(self, cost: CostEstimate) -> int:
        """``cost``'s worst case in whole blocks: what the replica may allocate for it."""
        block = self.block_tokens
        return -(-cost.kv_tokens // block) * block

    def shared_tokens(self, replica_id: str, block_hashes: Sequence[int], prompt_tokens: int) -> int:
        """Prompt tokens of ``block_hashes`` shared on ``replica_id``: its leading blocks that are,
        short of the block holding the prompt's last token (vLLM never hits that one). Asked only
        when a request would not fit whole, and over with the first block not shared."""
        blocks = self._blocks.get(replica_id)
        if not blocks:
            return 0
        hittable = min(len(block_hashes), (prompt_tokens - 1) // self.block_tokens)
        count = 0
        while count < hittable and block_hashes[count] in blocks:
            count += 1
        return count * self.block_tokens

    def first_token(self, request_id: str) -> bool:
        held = self._held.get(request_id)
        if held is None or held.first_token_seen:
            return False
        self._put(_decoding(held, held.produced_tokens))
        self._shift(held.replica_id, -held.cost.prompt_tokens, 0, 0, 0, -held.pending_uncached_tokens)
        self._share_computed(held)
        return True

    def produced(self, request_id: str, produced_tokens: int) -> bool:
        held = self._held.get(request_id)
        if held is None:
            return False
        total = min(max(produced_tokens, held.produced_tokens), held.cost.max_output_tokens)
        if total == held.produced_tokens and (held.first_token_seen or produced_tokens <= 0):
            return False
        self._put(_decoding(held, total))
        self._shift(
            held.replica_id,
            -held.pending_prompt_tokens,
            0,
            held.produced_tokens - total,
            0,
            -held.pending_uncached_tokens,
        )
        if not held.first_token_seen:
            self._share_computed(held)
        return True

    def _share_computed(self, held: Reservation) -> None:
        """``held``'s prefill is done: its prompt blocks are in the replica's cache, and those no one
        shares yet become shared, held by it (moved from its own charge to the shared blocks: the
        replica's reserved KV does not change). Of those someone else made shared meanwhile, its
        copies are the ones the replica may hand out when it was reserved no later than that one."""
        prompt = self._prompts.pop(held.request_id, None)
        if not prompt:
            return
        blocks = self._blocks.get(held.replica_id)
        if blocks is None:
            blocks = self._blocks[held.replica_id] = Counter()
            shared_by = self._shared_by[held.replica_id] = {}
        else:
            shared_by = self._shared_by[held.replica_id]
        holds = self._holds.get(held.request_id)
        if holds is None:
            holds = self._holds[held.request_id] = []
        reserved_at_s = held.reserved_at_s
        copies: list[int] = []
        for block in prompt[len(holds) :]:
            if block not in blocks:
                blocks[block] = 1
                shared_by[block] = reserved_at_s
                holds.append(block)
            elif shared_by[block] >= reserved_at_s:
                copies.append(block)
        if copies:
            self._copies[held.request_id] = copies

    def release(self, request_id: str) -> bool:
        held = self._held.pop(request_id, None)
        if held is None:
            return False
        replica_id = held.replica_id
        del self._by_replica[replica_id][request_id]
        kv_tokens = self.kv_block_tokens(held.cost)
        self._prompts.pop(request_id, None)
        holds = self._holds.pop(request_id, None)
        copies = self._copies.pop(request_id, None)
        blocks = self._blocks.get(replica_id)
        if blocks is not None and (holds or copies):
            shared_by = self._shared_by[replica_id]
            orphans = self._orphans.get(replica_id)
            kept_blocks = 0
            for block in holds or ():
                count = blocks[block] - 1
                if count:
                    blocks[block] = count
                    kept_blocks += 1
                else:
                    del blocks[block]
                    del shared_by[block]
                    if orphans and block in orphans:
                        orphans.discard(block)
                        kept_blocks -= 1
            for block in copies or ():
                if block in blocks:
                    if orphans is None:
                        orphans = self._orphans[replica_id] = set()
                    if block not in orphans:
                        orphans.add(block)
                        kept_blocks += 1
            kv_tokens -= kept_blocks * self.block_tokens
            if not blocks:
                del self._blocks[replica_id]
                del self._shared_by[replica_id]
            if orphans is not None and not orphans:
                del self._orphans[replica_id]
        self._shift(
            replica_id,
            -held.pending_prompt_tokens,
            -held.cost.sequences,
            -held.remaining_decode_tokens,
            -kv_tokens,
            -held.pending_uncached_tokens,
        )
        return True

    def renew(self, request_id: str, now_s: float) -> bool:
        held = self._held.get(request_id)
        if held is None:
            return False
        renewed = replace(held, lease_expires_at_s=now_s + self.lease_s)
        self._put(renewed)
        self._push_lease(renewed)
        return True

    def expire(self, now_s: float) -> list[Reservation]:
        expired: list[Reservation] = []
        while self._leases and self._leases[0][0] <= now_s:
            expires_at_s, request_id = heapq.heappop(self._leases)
            held = self._held.get(request_id)
            if held is not None and held.lease_expires_at_s == expires_at_s and self.release(request_id):
                expired.append(held)
        return expired

    def release_replica(self, replica_id: str) -> list[Reservation]:
        gone = list(self._by_replica.get(replica_id, {}).values())
        return [held for held in gone if self.release(held.request_id)]

    def get(self, request_id: str) -> Reservation | None:
        return self._held.get(request_id)

    def resident(self, replica_id: str) -> list[Reservation]:
        return list(self._by_replica.get(replica_id, {}).values())

    def load(self, replica_id: str) -> ReplicaLoad:
        return self._loads.get(replica_id, NO_LOAD)

    @property
    def loads(self) -> Mapping[str, ReplicaLoad]:
        """Every replica holding reservations, by id, live (a replica not in it has ``NO_LOAD``):
        for callers that read many replicas' loads at once."""
        return self._loads

    def totals(self) -> ReplicaLoad:
        total = NO_LOAD
        for load in self._loads.values():
            total = _sum(total, load, +1)
        return total

    def _push_lease(self, held: Reservation) -> None:
        if len(self._leases) > 4 * len(self._held) + 1024:
            self._leases = [(h.lease_expires_at_s, h.request_id) for h in self._held.values()]
            heapq.heapify(self._leases)
        else:
            heapq.heappush(self._leases, (held.lease_expires_at_s, held.request_id))

    def _put(self, held: Reservation) -> None:
        self._held[held.request_id] = held
        on_replica = self._by_replica.get(held.replica_id)
        if on_replica is None:
            on_replica = self._by_replica[held.replica_id] = {}
        on_replica[held.request_id] = held

    def _shift(
        self,
        replica_id: str,
        prefill_tokens: int,
        sequences: int,
        decode_tokens: int,
        kv_tokens: int,
        uncached_tokens: int,
    ) -> None:
        """Move ``replica_id``'s sums by the given deltas: one ``ReplicaLoad`` per change, and a
        replica whose sums are all zero has no entry (so ``load`` hands out the shared empty one)."""
        old = self._loads.get(replica_id, NO_LOAD)
        load = ReplicaLoad(
            old.pending_prompt_tokens + prefill_tokens,
            old.resident_sequences + sequences,
            old.remaining_decode_tokens + decode_tokens,
            old.reserved_kv_tokens + kv_tokens,
            old.pending_uncached_tokens + uncached_tokens,
        )
        if (
            load.resident_sequences == 0
            and load.pending_prompt_tokens == 0
            and load.remaining_decode_tokens == 0
            and load.reserved_kv_tokens == 0
        ):
            self._loads.pop(replica_id, None)
            self._by_replica.pop(replica_id, None)
        else:
            self._loads[replica_id] = load


NO_LOAD = ReplicaLoad()
"""The load of a replica holding no reservation: one shared object, so it compares by identity."""


def _sum(a: ReplicaLoad, b: ReplicaLoad, sign: int) -> ReplicaLoad:
    return ReplicaLoad(
        pending_prompt_tokens=a.pending_prompt_tokens + sign * b.pending_prompt_tokens,
        resident_sequences=a.resident_sequences + sign * b.resident_sequences,
        remaining_decode_tokens=a.remaining_decode_tokens + sign * b.remaining_decode_tokens,
        reserved_kv_tokens=a.reserved_kv_tokens + sign * b.reserved_kv_tokens,
        pending_uncached_tokens=a.pending_uncached_tokens + sign * b.pending_uncached_tokens,
    )


def _decoding(held: Reservation, produced_tokens: int) -> Reservation:
    """``held`` past its first token with ``produced_tokens`` generated; built directly, since
    ``dataclasses.replace`` costs twice as much on this per-chunk path."""
    return Reservation(
        held.request_id,
        held.replica_id,
        held.cost,
        held.reserved_at_s,
        held.lease_expires_at_s,
        True,
        produced_tokens,
        held.cached_prompt_tokens,
    )
