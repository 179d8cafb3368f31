"""``AdmissionPump``: the admission queue's waiters and the cycle that lets them go.

The controller orders the queue and says which queued requests fit (``on_capacity_freed``) or ran
out of time (``expire``); the pump pairs each ticket with whatever the edge waits on (a future, in
the gateway) and runs the dispatch cycle: each dispatch, in queue order, is offered to the edge's
``place`` (route and reserve), and one that could not be placed goes back to its place in the
queue, one whose client already left is dropped. It does no I/O and holds no clock: the edge calls
``dispatch`` after every release, on fleet changes and on a timer, with the snapshot of the moment.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Generic, TypeVar

from kvgate.admission.controller import AdmissionController
from kvgate.admission.decision import Dispatch, Refusal
from kvgate.vocabulary.snapshot import FleetSnapshot

Waiter = TypeVar("Waiter")


class Placement(Enum):
    PLACED = "placed"
    NO_ROOM = "no_room"
    """No replica takes it after all: back to its place in the queue."""
    GONE = "gone"
    """Its client left before hearing of it: dropped."""


class AdmissionPump(Generic[Waiter]):
    def __init__(self, controller: AdmissionController) -> None:
        self._controller = controller
        self._waiting: dict[int, Waiter] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def waiters(self) -> list[Waiter]:
        return list(self._waiting.values())

    def wait(self, ticket: int, waiter: Waiter) -> None:
        """``waiter`` waits on the queued ``ticket`` until it is dispatched, expires or leaves."""
        self._waiting[ticket] = waiter

    def leave(self, ticket: int) -> bool:
        """The client of ``ticket`` left while queued: its request stops counting at once. False
        when it was no longer waiting (dispatched or expired already)."""
        if self._waiting.pop(ticket, None) is None:
            return False
        self._controller.cancel(ticket)
        return True

    def dispatch(self, fleet: FleetSnapshot, place: Callable[[Waiter, Dispatch, float], Placement]) -> None:
        """Offer every queued request that fits now to ``place`` (with the snapshot's time), in queue
        order."""
        if not self._waiting:
            return
        controller = self._controller
        for dispatch in controller.on_capacity_freed(fleet):
            waiter = self._waiting.pop(dispatch.ticket, None)
            if waiter is None:
                continue
            placement = place(waiter, dispatch, fleet.now_s)
            if placement is Placement.PLACED:
                continue
            controller.requeue(dispatch)
            if placement is Placement.GONE:
                controller.cancel(dispatch.ticket)
            else:
                self._waiting[dispatch.ticket] = waiter

    def expire(self, fleet: FleetSnapshot) -> list[tuple[Waiter, Refusal]]:
        """The waiters whose wait budget ran out, each with the refusal to answer it with."""
        if not self._waiting:
            return []
        expired = []
        for gone in self._controller.expire(fleet):
            waiter = self._waiting.pop(gone.ticket, None)
            if waiter is not None:
                expired.append((waiter, gone.refusal))
        return expired

    def clear(self) -> list[Waiter]:
        """Every waiter, no longer waiting (the gateway is stopping)."""
        waiters = list(self._waiting.values())
        self._waiting.clear()
        return waiters
