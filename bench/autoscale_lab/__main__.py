"""The command line of ``python -m bench autoscale_lab`` (see the package's docstring)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import bench.autoscale_lab as package
from bench.autoscale_lab.compare import POLICIES, SEED, present_only, run_scenario
from bench.autoscale_lab.measures import present_only_table, table
from bench.autoscale_lab.plots import plot
from bench.autoscale_lab.scenarios import FULL, SCENARIOS, WEEKS
from bench.harness.cli import benchmark_parser, recorded


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("autoscale_lab", package.__doc__, seed=SEED)
    parser.add_argument(
        "--scenario",
        default="all",
        help=f"all, days (the four single days), weeks (the three weeks), or some of {','.join(SCENARIOS)}",
    )
    parser.add_argument("--policies", default=",".join(POLICIES), help="default: all five")
    parser.add_argument(
        "--oracle-headroom",
        type=float,
        help="follow the oracle's schedule at this headroom instead of searching for the leanest (one run "
        "instead of three or four)",
    )
    parser.add_argument(
        "--plots",
        help="folder for autoscale-lab-<scenario>.png (default: --out; docs to renew the documentation's, "
        "'' for none)",
    )
    parser.add_argument(
        "--present-only",
        type=_headrooms,
        default=(),
        metavar="HEADROOMS",
        help="also follow the oracle's schedule at these headrooms (e.g. 0.85,0.6,0.4) with no lead: "
        "the bound of any scaler without foresight",
    )
    args = parser.parse_args(argv)
    groups = {"all": FULL + WEEKS, "days": FULL, "weeks": WEEKS}
    names = groups.get(args.scenario) or tuple(args.scenario.split(","))
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    plots = args.out if args.plots is None else Path(args.plots) if args.plots else None
    with recorded(args.out):
        started = time.perf_counter()
        for name in names:
            result = run_scenario(
                name,
                args.seed,
                args.policies.split(","),
                progress=lambda line: print(line, flush=True),
                oracle_headroom=args.oracle_headroom,
            )
            print(table(result), flush=True)
            if args.present_only:
                bounds = present_only(
                    name, args.present_only, args.seed, progress=lambda line: print(line, flush=True)
                )
                print(present_only_table(result, bounds), flush=True)
            if plots is not None:
                print(f"  plot: {plot(result, plots / f'autoscale-lab-{name}.png')}", flush=True)
        print(f"done in {time.perf_counter() - started:.0f} s")
    return 0


def _headrooms(text: str) -> tuple[float, ...]:
    """Comma-separated utilisations in (0, 1]."""
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r}") from None
    if not all(0 < v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"each headroom must be in (0, 1]: {text!r}")
    return values


if __name__ == "__main__":
    sys.exit(main())
