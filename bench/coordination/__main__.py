"""The command line of ``python -m bench coordination`` (see the package's docstring)."""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
from pathlib import Path

import aiohttp

import bench.coordination as package
from bench.coordination.phase import Phase, run_phase
from bench.coordination.table import plot, row, table
from bench.harness import overload
from bench.harness.cli import benchmark_parser, recorded
from bench.harness.fleet import start_sim
from bench.harness.processes import children
from bench.harness.redis import start_redis
from kvgate.admission.tokenizer import TiktokenTokenizer
from kvgate.sim.ports import free_ports


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("coordination", package.__doc__)
    parser.add_argument("--duration-s", type=float, default=15.0)
    parser.add_argument("--overload", type=float, default=2.0)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument(
        "--gateways", default="1,2,4", help="gateway counts, coordinated; >1 also uncoordinated"
    )
    parser.add_argument("--retries", type=int, default=3)
    parser.add_argument("--share-a", type=float, default=0.75, help="tenant a's share of the requests")
    parser.add_argument("--ttft-slo-s", type=float, default=2.0)
    parser.add_argument("--itl-slo-s", type=float, default=0.025, help="mean inter-token objective")
    parser.add_argument("--itl-s", type=float, default=0.012, help="assumed decode step at full batch")
    parser.add_argument("--png", type=Path, help="plot path (default: coordination.png in --out)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="the simulator's (default 1)")
    args = parser.parse_args(argv)
    with recorded(args.out):
        asyncio.run(run(args))
    return 0


async def run(args: argparse.Namespace) -> None:
    png = args.png or args.out / "coordination.png"
    capacity_per_s = overload.capacity_per_s(args.replicas, args.itl_s)
    rate_per_s = args.overload * capacity_per_s
    rng = random.Random(0)
    arrivals: list[tuple[float, str, str]] = []
    t = rng.expovariate(rate_per_s)
    while t < args.duration_s:
        prompt = overload.prompt(rng)
        arrivals.append((t, prompt, "a" if rng.random() < args.share_a else "b"))
        t += rng.expovariate(rate_per_s)
    tokens = TiktokenTokenizer.from_name()
    kv_tokens = max(tokens.count(prompt) for _, prompt, _ in arrivals) + overload.MAX_TOKENS
    fits = overload.resident(args.replicas, kv_tokens)
    redis_port = free_ports()
    spec = overload.sim_spec(args.replicas, args.time_scale)
    with children() as started, tempfile.TemporaryDirectory() as redis_dir:
        redis = start_redis(started, redis_port, cwd=Path(redis_dir))
        sim = start_sim(started, spec, output=None)
        replica_urls = list(sim.urls)
        counts = [int(n) for n in args.gateways.split(",")]
        plan = [Phase(f"{n} coordinated", n, n > 1) for n in counts]
        plan += [Phase(f"{n} uncoordinated", n, False) for n in counts if n > 1]
        async with aiohttp.ClientSession() as session:
            await sim.ready(session)
        print(
            f"{args.replicas} simulated replicas (KV {overload.KV_CAPACITY_TOKENS} tokens each, "
            f"{fits} requests "
            f"of up to {kv_tokens} KV tokens fit them), capacity ~{capacity_per_s:.1f} req/s, offered "
            f"{rate_per_s:.1f} req/s ({args.overload}x) for {args.duration_s:.0f} s, tenant a "
            f"{args.share_a:.0%} of requests; {len(plan)} phases",
            file=sys.stderr,
        )
        redis_url = f"redis://127.0.0.1:{redis_port}/0"
        phases = []
        for phase in plan:
            print(f"phase {phase.name} ...", file=sys.stderr)
            phases.append(
                await run_phase(phase, replica_urls, redis_url, redis.pid, arrivals, args.retries, args.out)
            )
            rows = [row(p, args.ttft_slo_s, args.itl_slo_s, fits) for p in phases]
            print(table(rows).splitlines()[-1], file=sys.stderr)
    rows = [row(p, args.ttft_slo_s, args.itl_slo_s, fits) for p in phases]
    print(table(rows))
    plot(rows, png)
    print(f"\nplot: {png}")


if __name__ == "__main__":
    sys.exit(main())
