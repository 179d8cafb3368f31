"""The command line of ``python -m bench goodput`` (see the package's docstring)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import bench.goodput as package
from bench.goodput.run import bench
from bench.harness import peers
from bench.harness.cli import benchmark_parser, recorded
from bench.routing_lab import traces

POLICIES = ("kvgate", "round_robin", "least_request")
MIXED_KV_CAPACITY_TOKENS = 100_000
REPLAY_KV_CAPACITY_TOKENS = 450_000
"""The llama-3.1-8b-h100 profile's own KV cache: a replay runs full-size replicas."""


def parser() -> argparse.ArgumentParser:
    parser = benchmark_parser("goodput", package.__doc__, seed=0)
    parser.add_argument("--replicas", type=int, default=4, help="replicas per fleet (default 4)")
    parser.add_argument("--rate", type=float, default=16.0, help="offered requests/s (default 16)")
    parser.add_argument("--duration-s", type=float, default=36.0, help="trace length (default 36)")
    parser.add_argument("--slices", type=int, default=3, help="interleaved slices (default 3)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="simulator time scale (default 1)")
    parser.add_argument(
        "--kv-capacity-tokens",
        dest="kv_capacity_tokens_given",
        type=int,
        help="KV cache per replica (default 100000; a replay's: the profile's 450000)",
    )
    parser.add_argument("--slo-ttft-s", type=float, default=1.0, help="TTFT SLO (default 1 s)")
    parser.add_argument(
        "--slo-itl-s", type=float, default=0.05, help="mean inter-token gap SLO (default 0.05 s)"
    )
    parser.add_argument(
        "--trace",
        choices=("mixed", *traces.TRACES),
        default="mixed",
        help="mixed (default: this module's trace, set by --rate and --duration-s) or one of "
        "bench.routing_lab.traces (its own rate, duration, fleet shape and SLO replace those options)",
    )
    parser.add_argument(
        "--max-num-seqs", type=int, default=256, help="sequence slots per replica (default 256)"
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=0,
        help="times a client honours a 429's Retry-After (up to 30 s) and retries (default 0)",
    )
    parser.add_argument(
        "--admission",
        choices=("on", "off"),
        default="on",
        help="kvgate's admission in the kvgate rows (default on; off compares routing alone)",
    )
    parser.add_argument(
        "--slo-admission",
        choices=("on", "off"),
        default="on",
        help="give the kvgate rows the trace's TTFT and ITL objectives (admission.models.<m>.ttft_slo_s, "
        "itl_slo_s) as an operator serving that SLO would (default on)",
    )
    parser.add_argument(
        "--policies",
        type=lambda text: tuple(p for p in text.split(",") if p),
        default=POLICIES,
        help=f"kvgate routing policies to run, comma-separated (default {','.join(POLICIES)})",
    )
    parser.add_argument(
        "--peers",
        default="all",
        help=f"Rust routers to add: all (default; those installed), none, or some of "
        f"{', '.join(p.name for p in peers.PEERS)}",
    )
    parser.add_argument(
        "--peer-bin-dir", type=Path, help="where the routers' scripts are (e.g. another venv's bin)"
    )
    parser.add_argument("--png", type=Path, help="plot path (default: goodput.png in --out)")
    replay = parser.add_argument_group("a production trace in place of --trace (Mooncake format)")
    replay.add_argument(
        "--replay",
        help="a shape of bench.traces (at --rate for --duration-s) or a Mooncake-format JSONL file",
    )
    replay.add_argument("--speed", type=float, default=1.0, help="replay speed (default 1)")
    replay.add_argument("--start-s", type=float, default=0.0, help="where in the file to start (default 0)")
    replay.add_argument("--window-s", type=float, help="seconds of the file to replay (default: all)")
    replay.add_argument(
        "--slo-ttft-prompt-tokens-per-s",
        type=float,
        default=16_000.0,
        help="a replay's TTFT objective grows by the prompt over this rate (default 16000)",
    )
    replay.add_argument(
        "--cpu-offload-tokens",
        type=int,
        default=0,
        help="each replica's host-memory KV tier (default 0: none)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.replay:
        args.kv_capacity_tokens = args.kv_capacity_tokens_given or REPLAY_KV_CAPACITY_TOKENS
    elif args.trace != "mixed":
        chosen = traces.TRACES[args.trace]
        args.rate, args.duration_s = chosen.rate_rps, chosen.duration_s
        args.slo_ttft_s, args.slo_itl_s = chosen.slo_ttft_s, chosen.slo_itl_s
        args.replicas = chosen.replicas
        args.kv_capacity_tokens = chosen.profile_overrides["kv_capacity_tokens"]
        args.max_num_seqs = chosen.profile_overrides["max_num_seqs"]
    else:
        args.kv_capacity_tokens = args.kv_capacity_tokens_given or MIXED_KV_CAPACITY_TOKENS
    import uvloop

    with recorded(args.out):
        uvloop.run(bench(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
