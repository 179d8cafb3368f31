"""Which replicas may take a request at all, before any scoring.

A candidate must not be excluded by the caller (a retry goes to a replica not tried before), must
serve the request's model, be healthy, be ready (it reported healthy at least once; a replica is
never routable before that), be out of any back-off (ejection or a 429/503 avoid window) and have
KV room for the request's worst case (less the prompt blocks resident there, ``kvgate.vocabulary.sharing``)
and a sequence slot for each of its sequences, asked through ``kvgate.vocabulary.capacity.fits_sharing`` so
routing and admission cannot disagree. With admission turned off the
room filter is off too (``check_room``): the replicas' own schedulers queue what does not fit, and
the views keep their real capacity so the load scorer still measures load. Filters run in that order;
when none survive, the reason names the furthest filter any candidate reached, which is the
constraint actually binding (``no_kv_room`` tells the caller to queue, ``unhealthy`` that the fleet
is down).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from kvgate.routing.request import RoutingRequest
from kvgate.vocabulary.capacity import fits_sharing, own_slots
from kvgate.vocabulary.replica import ReplicaView
from kvgate.vocabulary.sharing import NOTHING_SHARED, ResidentPrefixes

FILTER_REASONS: tuple[str, ...] = ("excluded", "no_model", "unhealthy", "not_ready", "backoff", "no_kv_room")
"""Rejection reasons in filter order; a decision with no replica reports one of these or ``no_replica``."""
NO_REPLICA = "no_replica"


class Gate:
    """The filter chain bound to one request at one instant (a plain class: built per decision)."""

    __slots__ = (
        "check_room",
        "exclude",
        "hold_until_s",
        "now_s",
        "prefill_tokens_per_s",
        "request",
        "resident",
        "slots",
    )

    def __init__(
        self,
        request: RoutingRequest,
        now_s: float,
        exclude: Collection[str] = frozenset(),
        check_room: bool = True,
        hold_until_s: float = float("-inf"),
        resident: ResidentPrefixes = NOTHING_SHARED,
        slots: Callable[[ReplicaView], int] = own_slots,
        prefill_tokens_per_s: float = 0.0,
    ) -> None:
        self.request = request
        self.now_s = now_s
        self.exclude = exclude
        self.check_room = check_room
        self.hold_until_s = hold_until_s
        """Until when the request may be left waiting for a replica that holds its prefix to have
        room (a queued request the edge would rather place there than prefill elsewhere)."""
        self.resident = resident
        """What each replica already holds of the request's prompt: not charged for room."""
        self.slots = slots
        """The sequences each replica may run: admission's guard (``max_active``), so routing and
        admission count a replica full at the same number; its own slots without admission."""
        self.prefill_tokens_per_s = prefill_tokens_per_s
        """The replicas' measured prefill rate: turns a TTFT tolerance into prompt tokens."""

    def has_room(self, view: ReplicaView) -> bool:
        """Room for the request's worst case less the prompt blocks resident there."""
        request = self.request
        blocks = request.block_hashes
        return fits_sharing(
            view,
            request.kv_tokens,
            request.sequences,
            self.slots(view),
            blocks,
            self.resident,
            request.prompt_tokens,
        )

    def rejection(self, view: ReplicaView) -> str | None:
        """The first filter ``view`` fails, or None if it may take the request."""
        if view.replica_id in self.exclude:
            return "excluded"
        if self.request.model not in view.models:
            return "no_model"
        if not view.healthy:
            return "unhealthy"
        if view.ready_since_s is None or view.ready_since_s > self.now_s:
            return "not_ready"
        if view.backoff_until_s > self.now_s:
            return "backoff"
        if self.check_room and not self.has_room(view):
            return "no_kv_room"
        return None

    def passing(self, views: Sequence[ReplicaView]) -> tuple[list[ReplicaView], str]:
        """The views that pass every filter and, when there are none, the binding reason.

        The test is ``rejection``'s, written out once over the request's fields: it runs on every
        decision, while ``rejection`` is asked only for the reason when nothing passed."""
        exclude = self.exclude
        model = self.request.model
        now_s = self.now_s
        check_room = self.check_room
        has_room = self.has_room
        passed = [
            view
            for view in views
            if view.replica_id not in exclude
            and model in view.models
            and view.healthy
            and view.ready_since_s is not None
            and view.ready_since_s <= now_s
            and view.backoff_until_s <= now_s
            and (not check_room or has_room(view))
        ]
        if passed:
            return passed, ""
        furthest = -1
        for view in views:
            reason = self.rejection(view)
            if reason is not None:
                furthest = max(furthest, FILTER_REASONS.index(reason))
        return passed, FILTER_REASONS[furthest] if furthest >= 0 else NO_REPLICA
