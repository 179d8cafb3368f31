"""How loaded a replica is, in the two units a replica saturates by, comparable across candidates.

A replica fills up in tokens (its KV cache) and in sequences (its batch slots, ``max_num_seqs``),
and whichever fills first makes new work wait there. So load has two shares:

- the *token* share: outstanding work over KV capacity, i.e. prompt tokens waiting for their first
  token plus the decode tokens resident sequences may still produce;
- the *slot* share: resident sequences over the replica's sequence slots.

A trace of short chats saturates slots long before KV (each sequence is small, the batch is full),
a trace of long documents saturates KV with a few sequences; counting only tokens sends a short
request to a replica whose slots are all taken, where it queues behind them, and counting only
requests (what least-request routing does) cannot tell a 30,000-token prompt from a 50-token one.

kvgate's own reservations are exact about what kvgate sent and updated at decision time. A fresh
scrape of the replica's ``/metrics`` corrects the slot share upward when the replica reports
requests waiting for a slot (traffic kvgate did not send still takes slots): then its running and
waiting requests per slot. A scrape without a queue corrects nothing, because a scrape is up to an
interval old: the requests it saw running may have finished since, and a replica kvgate just
emptied would look full until the next one. The token share is not corrected: vLLM reports the KV
in use now (prompts and tokens already produced), not the work still to come, so the larger of the
two would mix quantities and keep a replica whose long sequences are about to finish looking full
(measured in ``bench.routing_lab``: it cost 4 points of goodput on the many-prefix trace). Candidates are
compared like with like: if any candidate's scrape is stale or missing, every candidate is measured
on kvgate's accounting alone, so a replica is never favoured just because its telemetry is older.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvgate.vocabulary.capacity import own_slots
from kvgate.vocabulary.replica import ReplicaView


def own_load_ratio(view: ReplicaView) -> float:
    load = view.load
    return (load.pending_prompt_tokens + load.remaining_decode_tokens) / view.kv_capacity_tokens


def own_slot_ratio(view: ReplicaView, slots: Callable[[ReplicaView], int] = own_slots) -> float:
    return view.load.resident_sequences / max(1, slots(view))


def scraped_slot_ratio(view: ReplicaView) -> float:
    """The replica's own word on its slots, when it says they are all taken: running and waiting
    requests per sequence slot while some wait; 0 while none does."""
    scraped = view.scraped
    if scraped is None or scraped.num_requests_waiting == 0:
        return 0.0
    return (scraped.num_requests_running + scraped.num_requests_waiting) / max(1, view.max_sequences)


def all_fresh(views: Sequence[ReplicaView], now_s: float, stale_s: float) -> bool:
    oldest_s = now_s - stale_s
    for view in views:
        scraped = view.scraped
        if scraped is None or scraped.scraped_at_s < oldest_s:
            return False
    return True


def load_ratios(
    views: Sequence[ReplicaView],
    now_s: float,
    stale_s: float,
    slots: Callable[[ReplicaView], int] = own_slots,
) -> tuple[list[float], list[float]]:
    """Each candidate's token share and slot share; slots corrected by scrapes only if every
    scrape is fresh. The slot share is over the sequences the replica may run (``slots``:
    admission's guard, which an inter-token-latency objective lowers), so a replica near its guard
    looks as full as admission will treat it. The expressions are ``own_load_ratio`` and
    ``own_slot_ratio`` written out: this runs for every candidate of every decision."""
    tokens = [
        (v.load.pending_prompt_tokens + v.load.remaining_decode_tokens) / v.kv_capacity_tokens for v in views
    ]
    if views and all_fresh(views, now_s, stale_s):
        return tokens, [max(own_slot_ratio(v, slots), scraped_slot_ratio(v)) for v in views]
    return tokens, [v.load.resident_sequences / max(1, slots(v)) for v in views]
