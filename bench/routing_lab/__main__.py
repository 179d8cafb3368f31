"""The command line of ``python -m bench routing_lab`` (see the package's docstring)."""

from __future__ import annotations

import argparse
import dataclasses
import sys

import bench.routing_lab as package
from bench.harness.cli import benchmark_parser, recorded
from bench.routing_lab.replay import lab_requests, play
from bench.routing_lab.table import print_results
from bench.routing_lab.traces import TRACES
from kvgate.config.routing import RoutingConfig
from kvgate.sim.profile import resolve_profile


def parser() -> argparse.ArgumentParser:
    parser = benchmark_parser("routing_lab", package.__doc__, seed=0)
    parser.add_argument("--trace", choices=sorted(TRACES), default="below")
    parser.add_argument("--policies", default="kvgate,round_robin,least_request")
    parser.add_argument("--admission", choices=("on", "off"), default="on")
    parser.add_argument("--rate", type=float, help="offered requests/s (default: the trace's)")
    parser.add_argument("--duration-s", type=float, help="seconds of arrivals (default: the trace's)")
    parser.add_argument("--max-wait-s", type=float, default=2.0, help="longest gateway wait (default 2)")
    parser.add_argument("--max-num-seqs", type=int, help="sequence slots per replica (default: the trace's)")
    parser.add_argument("--kv-tokens", type=int, help="KV tokens per replica (default: the trace's)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    trace = TRACES[args.trace]
    if args.rate:
        trace = dataclasses.replace(trace, rate_rps=args.rate)
    if args.duration_s:
        trace = dataclasses.replace(trace, duration_s=args.duration_s)
    overrides = dict(trace.profile_overrides)
    if args.max_num_seqs:
        overrides["max_num_seqs"] = args.max_num_seqs
    if args.kv_tokens:
        overrides["kv_capacity_tokens"] = args.kv_tokens
    trace = dataclasses.replace(trace, profile_overrides=overrides)
    with recorded(args.out):
        requests = lab_requests(trace.trace(args.seed))
        profile = resolve_profile(overrides=trace.profile_overrides)
        print(
            f"{trace.name}: {len(requests)} requests, {trace.replicas} replicas "
            f"(KV {profile.kv_capacity_tokens} tokens, {profile.max_num_seqs} sequences each); "
            f"SLO TTFT {trace.slo_ttft_s:g} s, mean ITL {1000 * trace.slo_itl_s:g} ms"
        )
        results = [
            play(
                requests,
                RoutingConfig.model_validate({"policy": name, "warmup_s": 0}),
                profile,
                trace.replicas,
                admission=args.admission == "on",
                max_queue_wait_s=args.max_wait_s,
            )
            for name in args.policies.split(",")
        ]
        print_results(results, trace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
