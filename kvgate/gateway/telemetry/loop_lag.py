"""The gateway's own measure of being starved: how late its event loop runs what is due.

Every socket read and write, every decision and every timer of the process runs on one event loop;
when the process is short of CPU (its cores are busy, a CPU limit throttles it, a long garbage
collection pauses it) all of them wait together, and no latency the gateway reports of replicas
says so. A task sleeping ``INTERVAL_S`` at a time measures how late it wakes: that lateness is what
anything else due at that moment waited too. It costs one timer every ``INTERVAL_S``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

INTERVAL_S = 0.1


async def watch_loop_lag(observe: Callable[[float], None], interval_s: float = INTERVAL_S) -> None:
    """Observe each wake-up's lateness (seconds) until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        due_s = loop.time() + interval_s
        await asyncio.sleep(interval_s)
        observe(max(0.0, loop.time() - due_s))
