"""Capacity claims: how several gateways share one replica without asking each other per request.

Gateways in front of one fleet each hold a *claim* on every replica: a number of KV tokens and of
sequence slots (under the inter-token-latency guard) that only it may admit into. The claims of a
replica never sum to more than its capacity (Redis grants them atomically,
``kvgate.gateway.coordination.coordinator``), and a gateway admits only within its own claim, so together the
gateways never over-commit a replica, and a request that fits the local claim is decided without a round trip,
as a rate limiter with local token buckets is.

Sizing, every ``interval_s`` in the background: each gateway publishes what it *wants* per replica
(what it uses now plus its unmet demand: work it queued or refused for capacity, spread over the
replicas by capacity) and is granted its max-min fair share of the replica over everyone's wants;
capacity that nobody wants is split evenly, so an idle gateway keeps room for a burst. A claim never
shrinks below what its gateway uses (admitted work is never revoked): a gateway that holds more than
its share gives the difference back as its streams end.

Order of a change, so that no instant over-commits: a gateway that shrinks its claim stops using the
difference *before* it tells Redis, and one that grows uses the new room only *after* Redis granted
it. A claim is valid for one lease from the moment it was asked for (the gateway's last sync), its
expiry in Redis being one lease from a later instant; past that the gateway is blind and
``kvgate.admission.coordination_gate`` decides (fail mode). Everything here is a value computation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kvgate.vocabulary.replica import ReplicaLoad


@dataclass(frozen=True, slots=True)
class Share:
    """An amount of one replica's capacity: KV tokens and sequence slots."""

    kv_tokens: int = 0
    sequences: int = 0

    def __add__(self, other: Share) -> Share:
        return Share(self.kv_tokens + other.kv_tokens, self.sequences + other.sequences)

    def at_least(self, other: Share) -> Share:
        return Share(max(self.kv_tokens, other.kv_tokens), max(self.sequences, other.sequences))

    def at_most(self, other: Share) -> Share:
        return Share(min(self.kv_tokens, other.kv_tokens), min(self.sequences, other.sequences))


NOTHING = Share()


@dataclass(frozen=True, slots=True)
class ReplicaDemand:
    """One gateway's side of one replica, as it stands when a sync begins."""

    capacity: Share
    """The replica's KV capacity and its sequence guard, as this gateway sees them."""
    used: Share
    """What this gateway's own reservations hold there."""
    unmet: Share = NOTHING
    """Work this gateway queued or refused for capacity, attributed to this replica."""

    @property
    def want(self) -> Share:
        return (self.used + self.unmet).at_most(self.capacity)


@dataclass(frozen=True, slots=True)
class Grant:
    """What Redis answered for one replica: this gateway's claim and what the others hold and want."""

    claim: Share
    others_claim: Share
    others_want: Sequence[Share] = ()
    """One entry per other live gateway that claims or wants something on the replica."""
    others_used_kv_tokens: int = 0
    """KV tokens the other gateways' reservations hold on the replica."""


def replica_capacity(kv_capacity_tokens: int, max_sequences: int, guard_sequences: int) -> Share:
    """What there is to claim on a replica: its KV tokens, and its slots under the inter-token-latency
    guard (the configured limit, or the replica's own sequence limit when it is lower), as
    ``AdmissionController`` applies it."""
    slots = max_sequences if 0 < max_sequences < guard_sequences else guard_sequences
    return Share(max(0, kv_capacity_tokens), slots)


def fair_level(capacity: int, wants: Iterable[int]) -> int:
    """The max-min fair level: the largest ``level`` with ``sum(min(w, level)) <= capacity``;
    ``capacity`` itself when every want fits."""
    ordered = sorted(max(0, w) for w in wants)
    remaining = capacity
    for index, want in enumerate(ordered):
        left = len(ordered) - index
        if want * left > remaining:
            return max(0, remaining // left)
        remaining -= want
    return capacity


def _fair_amount(capacity: int, mine: int, others: Sequence[int]) -> int:
    """Max-min fair share of ``mine`` among ``others`` plus an even split of what nobody wants."""
    level = fair_level(capacity, [mine, *others])
    allotted = min(mine, level)
    unwanted = capacity - allotted - sum(min(w, level) for w in others)
    return allotted + max(0, unwanted) // (1 + len(others))


def fair_share(capacity: Share, mine: Share, others: Sequence[Share]) -> Share:
    """This gateway's fair claim on a replica, per dimension (KV tokens and sequence slots)."""
    return Share(
        _fair_amount(capacity.kv_tokens, mine.kv_tokens, [o.kv_tokens for o in others]),
        _fair_amount(capacity.sequences, mine.sequences, [o.sequences for o in others]),
    )


def target(demand: ReplicaDemand, others_want: Sequence[Share]) -> Share:
    """The claim to ask Redis for: the fair share, never below what is in use."""
    return fair_share(demand.capacity, demand.want, others_want).at_least(demand.used)


def grant(asked: Share, capacity: Share, others_claim: Share) -> Share:
    """What Redis grants (the script in ``kvgate.gateway.coordination.coordinator`` computes the
    same): the claim asked for, cut to what the other live claims leave of the capacity."""
    free = Share(capacity.kv_tokens - others_claim.kv_tokens, capacity.sequences - others_claim.sequences)
    return asked.at_most(free).at_least(NOTHING)


def spread(unmet: Share, capacities: Mapping[str, Share]) -> dict[str, Share]:
    """Unmet demand attributed to each replica in proportion to its capacity (routing decides the
    replica only once the request fits, so demand is not tied to one)."""
    total_kv = sum(c.kv_tokens for c in capacities.values())
    total_seq = sum(c.sequences for c in capacities.values())
    return {
        replica: Share(
            -(-unmet.kv_tokens * c.kv_tokens // total_kv) if total_kv else 0,
            -(-unmet.sequences * c.sequences // total_seq) if total_seq else 0,
        )
        for replica, c in capacities.items()
    }


@dataclass(frozen=True, slots=True)
class Held:
    """A granted claim, and the capacity it is a part of."""

    claim: Share
    capacity: Share


@dataclass
class ClaimBook:
    """This gateway's claims per replica, and what the last sync learnt of the other gateways."""

    held: dict[str, Held] = field(default_factory=dict)
    others_want: dict[str, Sequence[Share]] = field(default_factory=dict)
    others_used: dict[str, int] = field(default_factory=dict)
    """KV tokens the other gateways' reservations hold per replica, as the last sync read them."""

    def plan(self, demands: Mapping[str, ReplicaDemand]) -> dict[str, Share]:
        """The claim to ask for per replica. A shrinking claim shrinks locally at once (the room it
        gives back is not used while Redis is being told); a growing one waits for the grant."""
        asked: dict[str, Share] = {}
        for replica, demand in demands.items():
            wanted = target(demand, self.others_want.get(replica, ()))
            asked[replica] = wanted
            current = self.held.get(replica)
            if current is not None:
                self.held[replica] = Held(current.claim.at_most(wanted), current.capacity)
        for replica in [r for r in self.held if r not in demands]:
            del self.held[replica]
        return asked

    def granted(self, grants: Mapping[str, Grant | None], capacities: Mapping[str, Share]) -> None:
        """Record what Redis granted; None for a replica it could not claim on (no claim there)."""
        for replica, answer in grants.items():
            if answer is None:
                self.held.pop(replica, None)
                self.others_want.pop(replica, None)
                self.others_used.pop(replica, None)
                continue
            self.held[replica] = Held(answer.claim, capacities[replica])
            self.others_want[replica] = tuple(answer.others_want)
            self.others_used[replica] = answer.others_used_kv_tokens
        for replica in [r for r in self.others_want if r not in grants]:
            del self.others_want[replica]
            self.others_used.pop(replica, None)

    def claimed(self) -> dict[str, Share]:
        return {replica: held.claim for replica, held in self.held.items()}

    def others_load(self) -> dict[str, ReplicaLoad]:
        """Per replica, the load that stands for everything outside this gateway's claim: added to
        the gateway's own reservations, it makes ``kvgate.vocabulary.capacity.fits`` answer exactly
        whether a request fits the claim."""
        return {
            replica: ReplicaLoad(
                0,
                max(0, held.capacity.sequences - held.claim.sequences),
                0,
                max(0, held.capacity.kv_tokens - held.claim.kv_tokens),
            )
            for replica, held in self.held.items()
        }
