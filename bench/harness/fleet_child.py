"""A fleet child: ``SimFleet`` replicas of one or more roles, served until SIGTERM.

``python -m bench.harness.fleet_child ROLE:N[,ROLE:N...] [--time-scale X] [--seed N] [--overrides JSON]
[--kv-events]``
prints ``{role: [url, ...]}`` as one JSON line once every replica serves (``fleet.start_fleet_child``
reads it); ``--overrides`` are profile fields (``{"warmup_s": 0, "kv_capacity_tokens": 50000}``);
``--kv-events`` has every replica publish its KV cache events, as vLLM's ``--kv-events-config`` does.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Mapping
from typing import Any

import orjson

from kvgate.sim.fleet import SimFleet
from kvgate.sim.kv_publisher import KvEventsConfig


async def serve(
    roles: Mapping[str, int], time_scale: float, seed: int, overrides: Mapping[str, Any], kv_events: bool
) -> None:
    events = KvEventsConfig() if kv_events else None
    async with SimFleet(
        replicas=0, time_scale=time_scale, seed=seed, overrides=overrides, kv_events=events
    ) as fleet:
        urls: dict[str, list[str]] = {}
        for role, count in roles.items():
            for _ in range(count):
                replica = await fleet.add_replica(role=role)
                urls.setdefault(role, []).append(replica.url)
        print(orjson.dumps(urls).decode(), flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.harness.fleet_child", description=__doc__)
    parser.add_argument("roles", help="ROLE:N[,ROLE:N...]")
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overrides", type=orjson.loads, default={})
    parser.add_argument("--kv-events", action="store_true")
    args = parser.parse_args(argv)
    roles = {role: int(count) for role, count in (part.split(":") for part in args.roles.split(","))}
    import uvloop

    uvloop.run(serve(roles, args.time_scale, args.seed, args.overrides, args.kv_events))
    return 0


if __name__ == "__main__":
    sys.exit(main())
