"""The command line of ``python -m bench autoscale`` (see the package's docstring)."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import bench.autoscale as package
from bench.autoscale.fluid_fleet import SCHEDULE
from bench.autoscale.model_mode import simulate, summarize
from bench.autoscale.plots import plot, plot_real
from bench.autoscale.real_figures import print_real, real_figures
from bench.autoscale.real_loop import RealRun, run_real
from bench.autoscale.real_plan import SCALE_RATIO, RealPlan
from bench.harness.cli import benchmark_parser, recorded


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("autoscale", package.__doc__, seed=1)
    parser.add_argument("--mode", choices=["real", "model"], default="real", help="default real")
    parser.add_argument("--png", type=Path, help="plot path (default: real.png or model.png in --out)")
    parser.add_argument(
        "--cold-start-s",
        type=float,
        default=None,
        help=f"replica cold start (default: model 120, real {180 / SCALE_RATIO:g} wall s)",
    )
    parser.add_argument("--end-s", type=float, default=SCHEDULE[-1].until_s, help="model: simulated seconds")
    parser.add_argument(
        "--scalers", default="kvgate,requests", help="real: runs, of kvgate and requests (default both)"
    )
    parser.add_argument("--base-rps", type=float, default=3.0, help="real: normal requests/s (default 3)")
    parser.add_argument("--warm-s", type=float, default=30.0, help="real: seconds before the burst")
    parser.add_argument("--burst-s", type=float, default=120.0, help="real: burst seconds")
    parser.add_argument("--tail-s", type=float, default=210.0, help="real: seconds after the burst")
    args = parser.parse_args(argv)
    with recorded(args.out) as out:
        png = args.png or out / f"{args.mode}.png"
        if args.mode == "model":
            model_mode(args, png)
        else:
            real_mode(args, out, png)
        print(f"plot: {png}")
    return 0


def model_mode(args: argparse.Namespace, png: Path) -> None:
    cold_start_s = 120.0 if args.cold_start_s is None else args.cold_start_s
    runs = {}
    for name in ("work", "conjunction", "requests"):
        timeline, fleet = simulate(name, args.end_s, cold_start_s, args.seed)
        summarize(name, timeline, fleet)
        runs[name] = timeline
    plot(runs, png)


def real_mode(args: argparse.Namespace, out: Path, png: Path) -> None:
    plan = RealPlan(
        base_rps=args.base_rps,
        warm_s=args.warm_s,
        burst_s=args.burst_s,
        tail_s=args.tail_s,
        cold_start_s=180.0 / SCALE_RATIO if args.cold_start_s is None else args.cold_start_s,
        seed=args.seed,
    )
    real_runs: list[RealRun] = []
    figures: dict[str, Any] = {}
    for name in args.scalers.split(","):
        run = asyncio.run(run_real(name, name, plan, out))
        figures[name] = real_figures(run)
        print_real(run, figures[name])
        real_runs.append(run)
    plot_real(real_runs, png)
    (out / "figures.json").write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    raise SystemExit(main())
