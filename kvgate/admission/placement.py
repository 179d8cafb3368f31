"""Where queued work would land if dispatched now, on a simulated copy of the fleet.

The queue's walk and a newcomer's place in queue order both ask the same question of a fleet that
fills up as the walk goes: does this entry fit anywhere once everything placed before it took its
room? ``fleet_placer`` answers it on copies of the replicas' views, each entry going to the
candidate with most room (where least-loaded routing would most likely put it);
``after_promises`` first sets aside the room of the promised slots that are due ahead of each entry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence

from kvgate.admission.promises import Promise
from kvgate.admission.queue import Place, QueuedRequest
from kvgate.vocabulary.capacity import fits_sharing, kv_room_tokens, routable
from kvgate.vocabulary.replica import ReplicaView
from kvgate.vocabulary.sharing import NOTHING_SHARED, ResidentPrefixes

MaxActive = Callable[[ReplicaView], int]
"""The inter-token-latency guard of one replica: how many sequences it may decode at once."""


def fleet_placer(
    replicas: Sequence[ReplicaView],
    now_s: float,
    max_active: MaxActive,
    resident: ResidentPrefixes = NOTHING_SHARED,
) -> Place:
    """Places entries one after another on a simulated copy of ``replicas``; an entry is not
    charged for the prompt blocks ``resident`` says a replica holds already."""
    originals = {v.replica_id: v for v in replicas}
    simulated = dict(originals)
    best_room: dict[str, int] = {}

    def place(entry: QueuedRequest) -> tuple[ReplicaView, ...] | None:
        if not any(
            v.load.resident_sequences < max_active(v) and kv_room_tokens(v) > 0 for v in simulated.values()
        ):
            return None
        kv_tokens = entry.kv_tokens
        cost = entry.request.cost
        sequences = cost.sequences
        model = entry.request.model
        blocks = entry.request.prompt_blocks
        if not blocks and best_room.get(model, kv_tokens) < kv_tokens:
            return ()
        serving = [v for v in simulated.values() if routable(v, model, now_s)]
        fitting = [
            v
            for v in serving
            if fits_sharing(v, kv_tokens, sequences, max_active(v), blocks, resident, cost.prompt_tokens)
        ]
        if not fitting:
            best_room[model] = max(
                (kv_room_tokens(v) for v in serving if v.load.resident_sequences < max_active(v)),
                default=0,
            )
            return ()
        fitting.sort(key=kv_room_tokens, reverse=True)
        chosen = fitting[0]
        load = chosen.load
        simulated[chosen.replica_id] = dataclasses.replace(
            chosen,
            load=dataclasses.replace(
                load,
                pending_prompt_tokens=load.pending_prompt_tokens + cost.prompt_tokens,
                resident_sequences=load.resident_sequences + sequences,
                remaining_decode_tokens=load.remaining_decode_tokens + cost.max_output_tokens,
                reserved_kv_tokens=load.reserved_kv_tokens + kv_tokens,
            ),
        )
        best_room.clear()
        return tuple(originals[v.replica_id] for v in fitting)

    return place


def after_promises(
    place: Place,
    due: Iterable[Promise],
    max_held_kv_tokens: float,
    on_held: Callable[[Promise], None] | None = None,
) -> Place:
    """``place``, where each entry first sets aside room for the due promises that go before it: a
    higher class, or its own class with an earlier slot (or any, for a newcomer). Room is set aside
    for at most ``max_held_kv_tokens`` of promises (their share of the fleet): returning clients go
    before new arrivals, but a burst of them never takes the whole fleet from newcomers.
    ``on_held`` hears of each promise whose room the fleet has now."""
    ordered = sorted(due, key=lambda p: (p.rank, p.due_s))
    if not ordered:
        return place
    held = iter(ordered)
    pending = next(held, None)
    held_kv_tokens = 0

    def place_after_promises(entry: QueuedRequest) -> tuple[ReplicaView, ...] | None:
        nonlocal pending, held_kv_tokens
        claimed_due_s = entry.promised_due_s
        while pending is not None and (
            pending.rank < entry.rank
            or (pending.rank == entry.rank and (claimed_due_s is None or pending.due_s < claimed_due_s))
        ):
            if held_kv_tokens + pending.kv_tokens <= max_held_kv_tokens:
                if place(QueuedRequest(0, pending.request, pending.due_s, pending.due_s)) and on_held:
                    on_held(pending)
                held_kv_tokens += pending.kv_tokens
            pending = next(held, None)
        return place(entry)

    return place_after_promises
