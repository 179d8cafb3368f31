"""``FleetSnapshot``: the fleet as one decision sees it, what admission and routing read of it.

Built by the edge once per decision from its live state (health, ramp, load, capacity, last
scrape), it is immutable, so a decision is a function of the snapshot, the request and the
decision's own state (the queue, the prefix index, and the resident reservations the wait forecast
reads by replica); two decisions over the same snapshot agree. Admission reads the snapshot;
routing chooses among the candidates admission took from it.
"""

from __future__ import annotations

from kvgate.vocabulary.replica import ReplicaView
from kvgate.vocabulary.sharing import NOTHING_SHARED, ResidentPrefixes
from kvgate.vocabulary.value import frozen_value


@frozen_value
class FleetSnapshot:
    now_s: float
    replicas: tuple[ReplicaView, ...]
    resident: ResidentPrefixes = NOTHING_SHARED
    """The prompt KV resident requests hold per replica (``kvgate/vocabulary/sharing.py``): room checks
    do not charge a request for the part of its prompt a replica already holds."""
