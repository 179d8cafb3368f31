"""How loaded a replica is, as one number comparable across the candidates of one decision.

Load is outstanding work relative to capacity: prompt tokens waiting for their first token plus
the decode tokens resident sequences may still produce, over the replica's KV capacity in tokens.
kvgate's own reservations are exact about what kvgate sent and updated at decision time; a fresh
scrape of the replica's ``/metrics`` corrects them upward when the replica reports more (KV usage
plus waiting requests as a share of its sequence slots), since traffic kvgate did not send still
occupies it. Candidates are compared like with like: if any candidate's scrape is stale or missing,
every candidate is measured on kvgate's accounting alone, so a replica is never favoured just
because its telemetry is older.
"""

from __future__ import annotations

from collections.abc import Sequence

from vocabulary.replica import ReplicaView


def own_load_ratio(view: ReplicaView) -> float:
    load = view.load
    return (load.pending_prompt_tokens + load.remaining_decode_tokens) / view.kv_capacity_tokens


def scraped_load_ratio(view: ReplicaView) -> float:
    """The replica's own word: KV in use plus waiting requests as a share of sequence slots."""
    scraped = view.scraped
    if scraped is None:
        return 0.0
    return scraped.kv_cache_usage_ratio + scraped.num_requests_waiting / max(1, view.max_sequences)


def all_fresh(views: Sequence[ReplicaView], now_s: float, stale_s: float) -> bool:
    oldest_s = now_s - stale_s
    for view in views:
        scraped = view.scraped
        if scraped is None or scraped.scraped_at_s < oldest_s:
            return False
    return True


def load_ratios(views: Sequence[ReplicaView], now_s: float, stale_s: float) -> list[float]:
    """Each candidate's load on the same metric: corrected by scrapes only if every scrape is fresh."""
    if views and all_fresh(views, now_s, stale_s):
        return [max(own_load_ratio(v), scraped_load_ratio(v)) for v in views]
    # own_load_ratio, written out: this runs for every candidate of every decision.
    return [
        (v.load.pending_prompt_tokens + v.load.remaining_decode_tokens) / v.kv_capacity_tokens for v in views
    ]


def within_bound(
    load_ratios: Sequence[float], cost_ratios: Sequence[float], bounded_load_factor: float
) -> list[bool]:
    """Whether each candidate's load is at most ``factor`` x the mean load once the request is placed.

    The mean counts the request itself (as consistent hashing with bounded loads does), so an idle
    pool does not forbid affinity everywhere and a replica may exceed the mean by one request.
    """
    total = sum(load_ratios)
    count = len(load_ratios)
    return [
        load <= bounded_load_factor * (total + cost) / count
        for load, cost in zip(load_ratios, cost_ratios, strict=True)
    ]
