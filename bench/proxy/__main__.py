"""The command line of ``python -m bench proxy`` (see the package's docstring)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import bench.proxy as package
from bench.harness.cli import benchmark_parser, recorded
from bench.proxy.decisions import answered_request, time_decisions
from bench.proxy.report import ProxyFigures, write_proxy_report
from bench.proxy.scenarios import run

PART_REQUESTS = 20000
"""Requests (or lines) each part is timed over in a report unless its own option says."""


def parser() -> argparse.ArgumentParser:
    parser = benchmark_parser("proxy", package.__doc__)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=4000, help="non-stream requests per side")
    parser.add_argument("--streams", type=int, default=600, help="streams per side and scenario")
    parser.add_argument(
        "--py-spy", metavar="FILE", help="run the gateway under py-spy, collapsed stacks to FILE"
    )
    parser.add_argument(
        "--only",
        help="comma-separated scenarios: non-stream, stream (back-to-back), 'stream paced', 'open loop', "
        "serial",
    )
    parser.add_argument(
        "--decisions", type=int, metavar="N", help="time only the decision path for N requests, in process"
    )
    parser.add_argument(
        "--client", type=int, metavar="N", help="time only the upstream client for N requests, in process"
    )
    parser.add_argument(
        "--access-log",
        type=int,
        metavar="N",
        help="time only an access-log line, N lines per way of writing it, in process",
    )
    parser.add_argument(
        "--tracing",
        type=int,
        metavar="N",
        help="time only a request's spans, N requests sampled and N sampled out, in process",
    )
    parser.add_argument(
        "--report",
        metavar="FILE",
        help=f"run the scenarios and then each part alone (N {PART_REQUESTS} unless given), and write "
        "the figures as markdown to FILE, keeping its one-off section",
    )
    parser.add_argument(
        "--peers",
        metavar="NAMES",
        help="compare router CPU per request with these Rust routers instead (comma-separated, or "
        "all; bench.proxy.peers)",
    )
    parser.add_argument("--peer-bin-dir", type=Path, help="where the routers' scripts are (with --peers)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per target (with --peers)")
    parser.add_argument(
        "--driver",
        choices=("raw", "aiohttp"),
        default="raw",
        help="with --peers: the load generator, a minimal keep-alive HTTP/1.1 client (raw) or aiohttp",
    )
    parser.add_argument(
        "--kvgate-from",
        metavar="NAME=DIR",
        action="append",
        default=[],
        help="with --peers, also a gateway run from the checkout DIR (another commit, a compiled "
        "build), named NAME; repeatable",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    with recorded(args.out):
        return _measure(args, sys.argv[1:] if argv is None else argv)


def _measure(args: argparse.Namespace, argv: list[str]) -> int:
    import uvloop

    if args.peers:
        from bench.proxy.peers import compare

        return uvloop.run(compare(args))
    if args.report:
        return report(args, argv)
    if args.decisions:
        per_request_us = asyncio.run(time_decisions(args.decisions))
        print(f"decision path: {per_request_us:.1f} us CPU per request ({args.decisions} requests)")
        return 0
    if args.client:
        from bench.proxy.client import time_clients

        aiohttp_us, replica_client_us = uvloop.run(time_clients(args.client, args.concurrency))
        print(f"upstream client, {args.client} non-stream requests at concurrency {args.concurrency}:")
        print(f"  aiohttp ClientSession  {aiohttp_us:7.1f} us CPU per request")
        print(f"  ReplicaClient          {replica_client_us:7.1f} us CPU per request")
        return 0
    if args.access_log or args.tracing:
        from bench.proxy.record import time_access_log, time_tracing

        request = asyncio.run(answered_request())
        timed = time_access_log(request, args.access_log) if args.access_log else {}
        timed |= time_tracing(request, args.tracing) if args.tracing else {}
        for label, per_request_us in timed.items():
            print(f"{per_request_us:7.1f} us CPU  {label}")
        return 0
    asyncio.run(run(args.concurrency, args.requests, args.streams, args.out, _only(args), args.py_spy))
    return 0


def report(args: argparse.Namespace, argv: list[str]) -> int:
    """Every measurement of this benchmark, in one run, written as markdown to ``args.report``."""
    import uvloop

    from bench.proxy.client import time_clients
    from bench.proxy.record import time_access_log, time_tracing

    scenarios, profile = asyncio.run(
        run(args.concurrency, args.requests, args.streams, args.out, _only(args), args.py_spy)
    )
    command = " ".join(["python -m bench proxy", *argv])
    figures = ProxyFigures(command, args.concurrency, scenarios, profile)
    decisions = args.decisions or PART_REQUESTS
    figures.decision_us = {f"{decisions}": asyncio.run(time_decisions(decisions))}
    aiohttp_us, replica_client_us = uvloop.run(time_clients(args.client or PART_REQUESTS, args.concurrency))
    figures.client_us = {"aiohttp `ClientSession`": aiohttp_us, "`ReplicaClient`": replica_client_us}
    request = asyncio.run(answered_request())
    figures.access_log_us = time_access_log(request, args.access_log or PART_REQUESTS)
    figures.tracing_us = time_tracing(request, args.tracing or PART_REQUESTS // 4)
    write_proxy_report(Path(args.report), figures)
    print(f"report: {args.report}")
    return 0


def _only(args: argparse.Namespace) -> set[str] | None:
    return set(args.only.split(",")) if args.only else None


if __name__ == "__main__":
    sys.exit(main())
