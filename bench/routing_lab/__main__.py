"""The command line of ``python -m bench routing_lab`` (see the package's docstring)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import bench.routing_lab as package
from bench.harness.cli import benchmark_parser, recorded
from bench.routing_lab.replay import lab_requests, play
from bench.routing_lab.replays import Replay, from_file, replay_requests, shaped
from bench.routing_lab.table import print_markdown, print_results
from bench.routing_lab.traces import TRACES
from bench.traces.shapes import SHAPES
from kvgate.config.routing import RoutingConfig
from kvgate.loadtest.reuse import reuse_ceiling
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
    replay = parser.add_argument_group("a production trace in place of --trace")
    replay.add_argument(
        "--replay", help=f"a shape ({', '.join(sorted(SHAPES))}) or a Mooncake-format JSONL file"
    )
    replay.add_argument("--speed", type=float, default=1.0, help="a file's replay speed (default 1)")
    replay.add_argument("--start-s", type=float, default=0.0, help="where in the file to start (default 0)")
    replay.add_argument("--window-s", type=float, help="seconds of the file to replay (default: all)")
    replay.add_argument("--settings", default="", help="routing settings for kvgate, KEY=VALUE,...")
    replay.add_argument(
        "--cpu-offload-tokens",
        type=int,
        default=0,
        help="a host-memory KV tier of this many tokens per replica, as vLLM's KV offloading (default: none)",
    )
    parser.add_argument(
        "--kv-events", action="store_true", help="the engines' KV cache events feed the router's index"
    )
    parser.add_argument(
        "--markdown", action="store_true", help="also print the rows as the documents' tables show them"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.replay:
        return _replay(args)
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
                kv_events=args.kv_events,
            )
            for name in args.policies.split(",")
        ]
        print_results(results, trace.slo_ttft_s, trace.slo_itl_s)
        if args.markdown:
            admission = args.admission == "on"
            print_markdown(results, trace.name, admission, args.kv_events, trace.slo_ttft_s, trace.slo_itl_s)
    return 0


def _replay(args: argparse.Namespace) -> int:
    if args.replay in SHAPES:
        replay = shaped(args.replay, args.rate or 4.0, args.duration_s or 300.0, args.seed)
    else:
        replay = from_file(Path(args.replay), args.start_s, args.window_s, args.speed)
    overrides = dict(replay.profile_overrides)
    if args.max_num_seqs:
        overrides["max_num_seqs"] = args.max_num_seqs
    if args.kv_tokens:
        overrides["kv_capacity_tokens"] = args.kv_tokens
    if args.cpu_offload_tokens:
        overrides["cpu_offload_tokens"] = args.cpu_offload_tokens
    settings = dict(pair.split("=", 1) for pair in args.settings.split(",") if pair)
    with recorded(args.out):
        requests = replay_requests(replay)
        profile = resolve_profile(overrides=overrides)
        print(
            f"{replay.name}: {len(requests)} requests over {requests[-1].arrival_s:.0f} s, {replay.replicas} "
            f"replicas (KV {profile.kv_capacity_tokens} tokens, {profile.max_num_seqs} sequences each); SLO "
            f"TTFT {replay.slo_ttft_s:g} s + prompt / {1 / replay.slo_ttft_per_prompt_token_s:,.0f} tok/s, "
            f"mean ITL {1000 * replay.slo_itl_s:g} ms"
        )
        print(
            _reuse_line(
                replay,
                replay.replicas * profile.kv_capacity_tokens,
                replay.replicas * profile.cpu_offload_tokens,
            )
        )
        results = [
            play(
                requests,
                RoutingConfig.model_validate(
                    {"policy": name, "warmup_s": 0, **(settings if name == "kvgate" else {})}
                ),
                profile,
                replay.replicas,
                admission=args.admission == "on",
                max_queue_wait_s=args.max_wait_s,
                kv_events=args.kv_events,
            )
            for name in args.policies.split(",")
        ]
        print_results(results, replay.slo_ttft_s, replay.slo_itl_s, replay.slo_ttft_per_prompt_token_s)
        if args.markdown:
            print_markdown(
                results,
                replay.name,
                args.admission == "on",
                args.kv_events,
                replay.slo_ttft_s,
                replay.slo_itl_s,
                replay.slo_ttft_per_prompt_token_s,
            )
    return 0


def _reuse_line(replay: Replay, gpu_tokens: int, host_tokens: int) -> str:
    """The replay's reuse ceiling, so each policy's hit rate reads against what was possible."""
    ceiling = reuse_ceiling(replay.requests, gpu_tokens).hit_ratio
    line = f"reuse ceiling: {ceiling:.3f} (one LRU cache of the fleet's {gpu_tokens:,} KV tokens)"
    if host_tokens:
        with_host = reuse_ceiling(replay.requests, gpu_tokens + host_tokens).hit_ratio
        line += f", {with_host:.3f} with the host tier ({host_tokens:,} tokens more)"
    return line


if __name__ == "__main__":
    sys.exit(main())
