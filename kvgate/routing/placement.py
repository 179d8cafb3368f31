"""Where a request waits least for its first token: placement by the prefill work left to do.

A request's first token waits for every prompt token its replica must still compute: those of the
requests ahead of it (the replica's *backlog*: prompt tokens routed there and not yet past their
first token, less what its cache was expected to serve them) and its own prompt less what that
replica's cache holds of it. So a candidate's *work* for a request is its backlog plus the
request's uncached tokens there, counted in prompt tokens, the unit prefill time is linear in; a
block in the host tier counts for the share of its prefill it saves (loading it over the host link
takes a fraction of computing it). The least work is where the first token comes soonest.

That alone would chase the smallest backlog and spread one conversation's turns over every
replica, each prefilling and caching it again. So the replica holding the longest prefix of the
request keeps it while its backlog exceeds the least backlog by at most ``bound_tokens`` (the
measured prefill rate times a TTFT tolerance: what the request may wait for its cache), and only
past that does the request spill to the least work. Only a prefix that tells the candidates apart
counts: one every candidate holds (a fleet-wide system prompt) saves the same everywhere and decides
nothing, and one shorter than ``affinity_min_tokens`` past what the others hold is not worth a wait.
Equal work is broken by the lighter load (tokens and sequence slots held), then by the seeded draw.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from kvgate.routing.picker import pick_best

PREFIX_AFFINITY = "prefix_affinity"
LEAST_WORK = "least_work"
LOAD_TIEBREAK = 1e-3
"""Weight of the load shares (each in [0, 1]) against one token of work: a tie-break only."""


@dataclass(frozen=True, slots=True)
class Work:
    """One candidate's work for one request, in prompt tokens."""

    cached_tokens: float
    """Of the request's prompt, what the candidate's cache serves (host-tier blocks by their saving)."""
    uncached_tokens: float
    backlog_tokens: int
    decode_tokens: float = 0.0
    """The candidate's decode work, weighed in prompt tokens (``decode_kv_weight`` per KV token its
    resident sequences hold)."""

    @property
    def load_tokens(self) -> float:
        return self.backlog_tokens + self.decode_tokens

    @property
    def total_tokens(self) -> float:
        return self.load_tokens + self.uncached_tokens


@dataclass(frozen=True, slots=True)
class Placement:
    index: int
    reason: str


def place(
    works: Sequence[Work],
    load_shares: Sequence[float],
    bound_tokens: float,
    affinity_min_tokens: float,
    rng: random.Random,
) -> Placement:
    """The candidate (an index into ``works``) a request should go to, and why."""
    cached = [w.cached_tokens for w in works]
    most = max(cached)
    if most - min(cached) >= affinity_min_tokens:
        least_load = min(w.load_tokens for w in works)
        holders = [i for i, c in enumerate(cached) if c == most]
        fits = [i for i in holders if works[i].load_tokens - least_load <= bound_tokens]
        if fits:
            totals = [-works[i].total_tokens - LOAD_TIEBREAK * load_shares[i] for i in fits]
            return Placement(fits[pick_best(totals, rng)], PREFIX_AFFINITY)
    totals = [-w.total_tokens - LOAD_TIEBREAK * share for w, share in zip(works, load_shares, strict=True)]
    return Placement(pick_best(totals, rng), LEAST_WORK)
