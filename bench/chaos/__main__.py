"""The command line of ``python -m bench chaos`` (see the package's docstring)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time

import aiohttp

import bench.chaos as package
from bench.chaos.checks import Run, Scenario
from bench.chaos.results import write_results
from bench.chaos.scenarios import SCENARIOS
from bench.harness.cli import benchmark_parser, recorded

QUICK_OR_FULL = {
    "clients": (500, 200),
    "slowloris": (600, 300),
    "slow_bodies": (500, 250),
    "nofile": (1024, 512),
    "hold_s": (25.0, 12.0),
    "redis_down_s": (8.0, 4.0),
}
"""Defaults of a full run and of ``--quick``, for the options not given."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = benchmark_parser("chaos", package.__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller counts and holds: about 1-2 minutes")
    parser.add_argument("--only", default="", help=f"comma-separated subset of {','.join(SCENARIOS)}")
    parser.add_argument("--clients", type=int, help="clients per storm (default 500; quick 200)")
    parser.add_argument("--slow-readers", type=int, default=20, help="non-reading streams (default 20)")
    parser.add_argument("--slowloris", type=int, help="partial-header connections (default 600; quick 300)")
    parser.add_argument("--slow-bodies", type=int, help="slow-body connections (default 500; quick 250)")
    parser.add_argument(
        "--nofile", type=int, help="the slowloris gateway's descriptor limit (1024; quick 512)"
    )
    parser.add_argument("--hold-s", type=float, help="how long slow clients hold on (default 25; quick 12)")
    parser.add_argument(
        "--kill-streams", type=int, default=40, help="streams when a replica dies (default 40)"
    )
    parser.add_argument("--redis-down-s", type=float, help="seconds Redis is down (default 8; quick 4)")
    parser.add_argument(
        "--redis-workers", type=int, default=6, help="looping clients per gateway (default 6)"
    )
    parser.add_argument(
        "--drain-bound-s", type=float, default=20.0, help="longest wait for gauges to reach 0"
    )
    args = parser.parse_args(argv)
    for name, (full, small) in QUICK_OR_FULL.items():
        if getattr(args, name) is None:
            setattr(args, name, small if args.quick else full)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"unknown scenario(s): {unknown}; choose from {list(SCENARIOS)}", file=sys.stderr)
        return 2
    with recorded(args.out), contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(play(args, names))
    return 130


async def play(args: argparse.Namespace, names: list[str]) -> int:
    out = args.out
    (out / "logs").mkdir(parents=True, exist_ok=True)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=180, sock_connect=10)
    started = time.monotonic()
    scenarios: list[Scenario] = []
    print(f"chaos benchmark ({'quick' if args.quick else 'full'}): {', '.join(names)}; results in {out}/")
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        run = Run(args, out, session)
        for name in names:
            print(f"== {name}", flush=True)
            try:
                scenarios.append(await SCENARIOS[name](run))
            except Exception as exc:
                broken = Scenario(name, "the scenario itself failed")
                broken.check("scenario ran", False, f"{type(exc).__name__}: {exc}")
                scenarios.append(broken)
    write_results(run, scenarios, time.monotonic() - started)
    failed = [(s.name, c.name) for s in scenarios for c in s.checks if not c.ok]
    print(f"\n{len(failed)} check(s) failed of {sum(len(s.checks) for s in scenarios)}:")
    for scenario_name, check in failed:
        print(f"  FAIL {scenario_name}: {check}")
    if run.unknown_keys:
        print(f"config keys unknown to this gateway (dropped): {', '.join(run.unknown_keys)}")
    print(f"results: {out / 'results.md'}, {out / 'results.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
