"""The clock every part of kvgate is given instead of reading the time itself: seconds, monotonic.

The pure cores take ``now_s`` values from it; the gateway builds its parts over one (``Gateway(config,
clock)``), which is what lets a test replay a trace on a manual clock.
"""

from __future__ import annotations

from collections.abc import Callable

Clock = Callable[[], float]
