"""Whether one replica can take one more request without over-committing it.

Two guards, both worst-case: the replica's KV cache must hold every admitted sequence at its full
``prompt + max_output`` length (so vLLM never has to preempt), and its active sequences must stay
below the inter-token-latency guard (one more sequence slows every sequence already decoding), with a
request of ``n`` sequences taking ``n`` of them. The prompt blocks requests resident on the replica
already hold are not charged twice (``fits_sharing``, ``kvgate/vocabulary/sharing.py``).
Routing filters and the admission decision both ask this one question.

``routable`` is the question admission asks first: may the replica take a request for this model
at all now (healthy, ready, out of back-off, serving the model, and not a decode-only replica,
which takes work only by hand-off, asked through ``takes_handoff``)? Routing's filter chain
(``kvgate.routing.filters``) asks the same conditions one at a time, to name the one that binds when
nothing passes.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvgate.vocabulary.replica import ReplicaView, Role
from kvgate.vocabulary.sharing import ResidentPrefixes


def kv_room_tokens(view: ReplicaView) -> int:
    return view.kv_capacity_tokens - view.load.reserved_kv_tokens


def own_slots(view: ReplicaView) -> int:
    """A replica's sequence slots as it reports them (its ``max_num_seqs``): the limit where nothing
    lower applies, such as admission's inter-token-latency guard."""
    return view.max_sequences


def fits(view: ReplicaView, kv_tokens: int, sequences: int, max_active_sequences: int) -> bool:
    """True when ``view`` can hold ``kv_tokens`` more and has a slot under the guard for each of the
    request's ``sequences`` (a request with ``n`` sequences decodes ``n`` at once)."""
    load = view.load
    return (
        kv_tokens <= view.kv_capacity_tokens - load.reserved_kv_tokens
        and load.resident_sequences + sequences <= max_active_sequences
    )


def fits_sharing(
    view: ReplicaView,
    kv_tokens: int,
    sequences: int,
    max_active_sequences: int,
    block_hashes: Sequence[int],
    resident: ResidentPrefixes,
    prompt_tokens: int,
) -> bool:
    """``fits``, not charging the request for the prompt blocks ``resident`` says ``view`` holds
    already for its ``prompt_tokens``-token prompt; those are looked up only when the whole would
    not fit, which most checks never need."""
    if fits(view, kv_tokens, sequences, max_active_sequences):
        return True
    if not block_hashes:
        return False
    shared = resident.shared_tokens(view.replica_id, block_hashes, prompt_tokens)
    return shared > 0 and fits(view, kv_tokens - shared, sequences, max_active_sequences)


def routable(view: ReplicaView, model: str, now_s: float) -> bool:
    return (
        view.healthy
        and view.ready_since_s is not None
        and view.ready_since_s <= now_s
        and view.backoff_until_s <= now_s
        and model in view.models
        and view.role is not Role.DECODE
    )


def takes_handoff(view: ReplicaView, model: str, now_s: float) -> bool:
    """``routable``'s question for the second hop of a disaggregated request: a decode replica,
    otherwise as able to take work as ``routable`` asks."""
    return (
        view.role is Role.DECODE
        and view.healthy
        and view.ready_since_s is not None
        and view.ready_since_s <= now_s
        and view.backoff_until_s <= now_s
        and model in view.models
    )
