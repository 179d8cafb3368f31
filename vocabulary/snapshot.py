"""``FleetSnapshot``: the fleet as one decision sees it, the only thing admission and routing read.

Built by the edge once per decision from its live state (health, ramp, load, capacity, last
scrape), it is immutable, so a decision is a function of the snapshot, the request and the
decision's own state (the queue, the prefix index); two decisions over the same snapshot agree.
"""

from __future__ import annotations

from vocabulary.replica import ReplicaView
from vocabulary.value import frozen_value


@frozen_value
class FleetSnapshot:
    now_s: float
    replicas: tuple[ReplicaView, ...]
