"""Prompt KV a replica already holds for the requests resident there, which a request sharing their
prefix does not need room for.

vLLM's prefix caching keeps one copy of a KV block however many running sequences share it: sixteen
chats over one 2,600-token system prompt hold that prompt once, not sixteen times. Counting every
request's whole prompt as its own made admission refuse room a replica had (on the routing lab's
session-heavy trace the gateway queued a third of the requests at 18 req/s, where the replicas
would have run them at once). ``ResidentPrefixes`` answers, for one replica and one request's
chained block hashes, how many of its prompt tokens are already held there by resident requests;
the room checks of admission and routing subtract it. Chained hashes make the answer a prefix: a
block resident means every block before it is too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class ResidentPrefixes(Protocol):
    def shared_tokens(self, replica_id: str, block_hashes: Sequence[int], prompt_tokens: int) -> int:
        """Tokens of the prompt ``block_hashes`` (``prompt_tokens`` long) that resident requests on
        ``replica_id`` hold and the replica's prefix cache will give it: whole blocks, never the one
        holding the prompt's last token, which vLLM computes again to produce the first token."""
        ...


class _NothingShared:
    def shared_tokens(self, replica_id: str, block_hashes: Sequence[int], prompt_tokens: int) -> int:
        return 0


NOTHING_SHARED: ResidentPrefixes = _NothingShared()
"""For callers that do not track what is resident: every request pays for its whole prompt."""
