"""Every chaos scenario by the name ``--only`` takes, in the order a full run plays them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from bench.chaos.checks import Run, Scenario
from bench.chaos.redis_restart import redis_restart
from bench.chaos.slow_clients import slow_readers, slowloris
from bench.chaos.storms import replica_kill, storm_queued, storm_streaming

SCENARIOS: dict[str, Callable[[Run], Awaitable[Scenario]]] = {
    "storm_streaming": storm_streaming,
    "storm_queued": storm_queued,
    "slow_readers": slow_readers,
    "slowloris": slowloris,
    "replica_kill": replica_kill,
    "redis_restart": redis_restart,
}
