"""The command line of ``python -m bench neighbours`` (see the package's docstring)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import bench.neighbours as package
from bench.harness.cli import benchmark_parser, recorded
from bench.neighbours.loop_lag import loop_lag
from bench.neighbours.phases import run, summarize
from bench.neighbours.prompts import SHAPES


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("neighbours", package.__doc__)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--phase-s", type=float, default=5.0, help="seconds per phase")
    parser.add_argument(
        "--variant",
        choices=("over", "fits", "both"),
        default="both",
        help="the huge prompt over the model's context, fitting it, or each in turn",
    )
    parser.add_argument("--size-mb", type=float, default=1.0, help="huge prompt size (MB, 10^6 bytes)")
    parser.add_argument(
        "--shape",
        default="words",
        help=f"the huge prompt's shapes, comma-separated or all ({', '.join(SHAPES)})",
    )
    parser.add_argument(
        "--checkout",
        action="append",
        type=Path,
        help="a source tree to run a gateway from (default: this one)",
    )
    parser.add_argument("--up", action="store_true", help="kvgate up (replicas in the gateway's process)")
    parser.add_argument("--py-spy", metavar="FILE", help="record the first gateway with py-spy into FILE")
    parser.add_argument(
        "--loop-lag",
        action="store_true",
        help="instead: the event-loop stall per huge prompt counted by each checkout's encoder, in-process",
    )
    parser.add_argument("--prompts", type=int, default=10, help="--loop-lag: prompts per child")
    args = parser.parse_args(argv)
    if args.up and args.variant != "over":
        parser.error("--up runs kvgate up's own model window: only --variant over")
    shapes = SHAPES if args.shape == "all" else tuple(args.shape.split(","))
    if not set(shapes) <= set(SHAPES):
        parser.error(f"--shape {args.shape}: known shapes are {', '.join(SHAPES)} and all")
    checkouts = [c.resolve() for c in args.checkout or [Path.cwd()]]
    with recorded(args.out) as out:
        if args.loop_lag:
            loop_lag(checkouts, args.rounds, args.prompts, out, shapes)
            return 0
        phases = []
        size_bytes = int(args.size_mb * 1e6)
        for variant in ("over", "fits") if args.variant == "both" else (args.variant,):
            for shape in shapes:
                options = (args.rounds, args.phase_s, variant, size_bytes, args.py_spy, out, args.up, shape)
                measured = run(checkouts, *options)
                phases += asyncio.run(measured)
        summarize(phases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
