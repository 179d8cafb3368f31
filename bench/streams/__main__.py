"""The command line of ``python -m bench streams`` (see the package's docstring)."""

from __future__ import annotations

import argparse
import resource
import sys
from pathlib import Path

import orjson

import bench.streams as package
from bench.harness.cli import benchmark_parser, recorded
from bench.streams.figures import Point, PointResult, print_row, result_of
from bench.streams.measure import Timing, backend_cost, backends, largest_point, measure

DEFAULT = Timing()


def parser() -> argparse.ArgumentParser:
    parser = benchmark_parser("streams", package.__doc__)
    parser.add_argument("--points", default="1000@1000,2000@1000,5000@1000,9900@1000,400@30")
    parser.add_argument(
        "--open-per-s", type=float, default=DEFAULT.open_per_s, help="streams opened per second"
    )
    parser.add_argument(
        "--window-s", type=float, default=DEFAULT.window_s, help="seconds of the steady window"
    )
    parser.add_argument(
        "--settle-s", type=float, default=DEFAULT.settle_s, help="seconds from the last opening to the window"
    )
    parser.add_argument(
        "--tail-s", type=float, default=DEFAULT.tail_s, help="seconds every stream outlives the window by"
    )
    parser.add_argument(
        "--idle-s", type=float, default=DEFAULT.idle_s, help="seconds the gateway is watched idle first"
    )
    parser.add_argument("--drivers", type=int, default=2, help="driver processes")
    parser.add_argument(
        "--report",
        metavar="FILE",
        type=Path,
        help="write the table as markdown to FILE, a PNG beside it (default: streams.md in --out)",
    )
    parser.add_argument(
        "--gateway-code",
        metavar="DIR",
        type=Path,
        help="run the gateway from this checkout (with this benchmark's files copied in): a before/after",
    )
    parser.add_argument(
        "--results", metavar="FILE", type=Path, help="every figure as JSON (default: results.json in --out)"
    )
    parser.add_argument(
        "--render", metavar="FILE", type=Path, help="only write the report from a results FILE"
    )
    parser.add_argument(
        "--backend-cost",
        metavar="POINT",
        help="only measure the CPU per token of the simulator and of the paced backends holding POINT",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser_ = parser()
    args = parser_.parse_args(argv)
    timing = Timing(args.open_per_s, args.window_s, args.settle_s, args.tail_s, args.idle_s)
    with recorded(args.out) as out:
        report_path = args.report or out / "streams.md"
        if args.backend_cost:
            backend_cost(Point.parse(args.backend_cost), timing, args.drivers)
            return 0
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        command = " ".join(["python -m bench streams", *(sys.argv[1:] if argv is None else argv)])
        if args.render:
            saved = orjson.loads(args.render.read_bytes())
            _report(report_path, [result_of(fields) for fields in saved["results"]], saved["command"], hard)
            return 0
        points = [Point.parse(text) for text in args.points.split(",")]
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        ceiling = largest_point(hard)
        too_many = [p for p in points if p.streams > ceiling]
        if too_many:
            parser_.error(
                f"{', '.join(map(str, too_many))}: a gateway holds two descriptors per stream and at most "
                f"{ceiling} streams under this machine's descriptor limit ({hard})"
            )
        results_path = args.results or out / "results.json"
        results: list[PointResult] = []
        with backends() as ports:
            for point in points:
                results.append(measure(point, ports, timing, args.drivers, out, args.gateway_code))
                results_path.write_bytes(orjson.dumps({"command": command, "results": results}))
                print_row(results[-1])
        print("\nall points:")
        for result in results:
            print_row(result)
        _report(report_path, results, command, hard)
        return 0


def _report(path: Path, results: list[PointResult], command: str, descriptors: int) -> None:
    from bench.streams.report import write_streams_report

    write_streams_report(path, results, command, descriptors)
    print(f"report: {path}")


if __name__ == "__main__":
    sys.exit(main())
