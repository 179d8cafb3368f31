"""The two phases of a disaggregated request: what each pool holds for it, and where its decode fits.

A model served by a prefill+decode pair runs each request twice: a prefill replica computes the
prompt's KV (one output token per sequence) and hands it off; a decode replica takes the KV and
generates. So a request holds work on two pools, one after the other: on the prefill replica its
prompt and one token per sequence (``prefill_cost``), from routing until the hand-off; on the
decode replica its whole worst case, ``prompt + max_output`` (the request's own cost), from the
hand-off until it ends. The decode replica is chosen among those with room for that worst case and
a slot per sequence under the inter-token-latency guard (``handoff_candidates``), the guard that
matters where the tokens are generated. Admission asks the same question before the prefill hop,
so a request is not prefilled only to find no decode room.
"""

from __future__ import annotations

from collections.abc import Callable

from kvgate.admission.cost import CostEstimate
from kvgate.vocabulary.capacity import fits, kv_room_tokens, takes_handoff
from kvgate.vocabulary.replica import ReplicaView
from kvgate.vocabulary.snapshot import FleetSnapshot


def prefill_cost(cost: CostEstimate) -> CostEstimate:
    """What the prefill replica holds for ``cost``'s request: its prompts and one token a sequence."""
    sequences = cost.sequences
    return CostEstimate(cost.model, cost.prompt_tokens, sequences, cost.kv_bytes_per_token, sequences)


def handoff_candidates(
    cost: CostEstimate, fleet: FleetSnapshot, max_active: Callable[[ReplicaView], int]
) -> tuple[list[ReplicaView], list[ReplicaView]]:
    """The decode replicas that could take the request now and, of those, the ones it fits on (most
    room first; a stable sort keeps equal room in fleet order)."""
    now_s = fleet.now_s
    serving = [v for v in fleet.replicas if takes_handoff(v, cost.model, now_s)]
    fitting = [v for v in serving if fits(v, cost.kv_tokens, cost.sequences, max_active(v))]
    fitting.sort(key=kv_room_tokens, reverse=True)
    return serving, fitting
