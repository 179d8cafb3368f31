"""Which candidate wins once every candidate has a total score: the highest, ties drawn at random.

Scores within ``TIE_EPSILON`` of the best count as tied (float sums of equal parts can differ in
the last bit). The tie-break draws from the injected seeded ``random.Random``, so replays are
reproducible and equal replicas share traffic instead of the first in the list taking all of it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

TIE_EPSILON = 1e-9


def pick_best(totals: Sequence[float], rng: random.Random) -> int:
    """Index of the winning total; ``totals`` must not be empty."""
    if len(totals) == 1:
        return 0
    floor = max(totals) - TIE_EPSILON
    tied = [i for i, total in enumerate(totals) if total >= floor]
    return tied[0] if len(tied) == 1 else rng.choice(tied)
