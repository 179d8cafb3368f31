"""The reuse ceiling of a replay: the prefix hit rate one cache as large as the whole fleet's would get.

A router's prefix hit rate means little alone: a trace whose requests share nothing has a ceiling
of 0, one whose conversations come back after the caches turned over has a low one. So a replay
states, beside each router's hit rate, what one LRU cache of the fleet's total KV capacity (GPU,
and the host tier where there is one) would hit, fed the same requests in arrival order: every
prompt looks up its blocks from the first and stops at the first miss, as vLLM's prefix cache does
(never counting the prompt's last token, which vLLM always computes), then its blocks and its
output's take the most recent places. Requests in flight are not pinned, so the ceiling is a little
generous when caches are full of running sequences; no router placing requests on separate replicas
can beat it, since the fleet's caches together are at most this one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from kvgate.loadtest.mooncake import MooncakeRequest


@dataclass(frozen=True, slots=True)
class Reuse:
    queried_tokens: int
    hit_tokens: int
    capacity_tokens: int

    @property
    def hit_ratio(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


def reuse_ceiling(requests: Sequence[MooncakeRequest], capacity_tokens: int) -> Reuse:
    """Hit rate in tokens (vLLM's ``prefix_cache_hits / prefix_cache_queries``) of one LRU cache of
    ``capacity_tokens`` fed ``requests`` in order."""
    cache: OrderedDict[tuple[int, int], int] = OrderedDict()
    """(hash id, length) -> tokens, least recently used first; an output is its own unique entry."""
    held = queried = hit = 0
    for number, request in enumerate(requests):
        matched = 0
        for hash_id, length in zip(request.hash_ids, request.block_lengths(), strict=True):
            if (hash_id, length) not in cache:
                break
            matched += length
        queried += request.input_length
        hit += min(matched, request.input_length - 1)
        entries = [
            *zip(request.hash_ids, request.block_lengths(), strict=True),
            (-1 - number, request.output_length),
        ]
        for key in entries:
            if key in cache:
                cache.move_to_end(key)
            else:
                cache[key] = key[1]
                held += key[1]
        while held > capacity_tokens and cache:
            _, tokens = cache.popitem(last=False)
            held -= tokens
    return Reuse(queried, hit, capacity_tokens)
