"""The command line of ``python -m bench pd`` (see the package's docstring)."""

from __future__ import annotations

import sys
from pathlib import Path

import bench.pd as package
from bench.harness.cli import benchmark_parser, recorded
from bench.pd.run import bench
from bench.pd.workloads import TRACES


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("pd", package.__doc__, seed=0)
    parser.add_argument(
        "--gpus", type=int, default=4, help="simulated GPUs (replicas) per target (default 4)"
    )
    parser.add_argument("--prefill", type=int, default=2, help="of them, prefill replicas in P/D (default 2)")
    parser.add_argument("--rate", type=float, default=6.0, help="offered requests/s (default 6)")
    parser.add_argument("--duration-s", type=float, default=20.0, help="trace length (default 20)")
    parser.add_argument("--slices", type=int, default=2, help="interleaved slices (default 2)")
    parser.add_argument("--traces", default=",".join(TRACES), help=f"some of {', '.join(TRACES)}")
    parser.add_argument("--time-scale", type=float, default=1.0, help="simulator time scale (default 1)")
    parser.add_argument("--slo-ttft-s", type=float, default=2.0, help="TTFT SLO (default 2 s)")
    parser.add_argument(
        "--slo-itl-s", type=float, default=0.05, help="mean inter-token gap SLO (default 0.05 s)"
    )
    parser.add_argument("--peer-bin-dir", type=Path, help="where vllm-router is (e.g. another venv's bin)")
    parser.add_argument("--report", type=Path, help="markdown table path (default: pd.md in --out)")
    parser.add_argument("--png", type=Path, help="plot path (default: pd.png in --out)")
    args = parser.parse_args(argv)
    if not 0 < args.prefill < args.gpus:
        parser.error(f"--prefill must be between 1 and --gpus - 1, got {args.prefill}")
    import uvloop

    with recorded(args.out):
        uvloop.run(bench(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
