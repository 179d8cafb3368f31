"""Routing benchmark: time per decision against fleet size, and prefix-index memory per replica.

Decisions run on a prepared fleet snapshot (building views is the gateway's cost, measured
elsewhere) with a warmed prefix index: requests share one of 8 system prompts of 2,048 tokens and
add 256 tokens of their own, as in the prefix replay. Each ``choose`` includes recording the routed
prompt in the index. Memory is measured with ``tracemalloc`` for an index filled to capacity with
blocks that no other replica holds (the worst case: no sharing of the reverse map's entries).

Run: ``python -m bench routing [--decisions N] [--capacity-blocks N] [--fleet-sizes 10,100,1000]``.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Sequence

from bench.harness.cli import benchmark_parser, recorded
from kvgate.config.routing import PolicyName, RoutingConfig
from kvgate.routing.prefix_hash import block_hashes
from kvgate.routing.prefix_index import PrefixIndex
from kvgate.routing.request import RoutingRequest
from kvgate.routing.router import Router
from kvgate.vocabulary.replica import ReplicaLoad, ReplicaView, Role

MODEL = "bench-model"
FLEET_SIZES = (10, 100, 1_000)


def fleet(size: int, rng: random.Random) -> list[ReplicaView]:
    views = []
    for i in range(size):
        decode_tokens = rng.randrange(0, 40_000)
        views.append(
            ReplicaView(
                replica_id=f"replica-{i:04}",
                url=f"http://10.0.{i // 250}.{i % 250}:8000",
                pool="default",
                role=Role.MIXED,
                models=frozenset({MODEL}),
                kv_capacity_tokens=400_000,
                max_sequences=256,
                healthy=True,
                ready_since_s=-3_600.0,
                load=ReplicaLoad(
                    pending_prompt_tokens=rng.randrange(0, 8_000),
                    resident_sequences=rng.randrange(0, 64),
                    remaining_decode_tokens=decode_tokens,
                    reserved_kv_tokens=decode_tokens * 4,
                ),
            )
        )
    return views


def requests(count: int, rng: random.Random) -> list[RoutingRequest]:
    systems = [[1_000_000 * (p + 1) + i for i in range(2_048)] for p in range(8)]
    out = []
    for _ in range(count):
        prompt = [*rng.choice(systems), *(rng.randrange(100_000) for _ in range(256))]
        out.append(RoutingRequest(MODEL, len(prompt), 256, tuple(block_hashes(prompt))))
    return out


def time_decisions(
    policy: PolicyName,
    sample_size: int,
    views: Sequence[ReplicaView],
    batch: Sequence[RoutingRequest],
    repeats: int,
) -> tuple[float, float]:
    """Mean and 99th percentile CPU time of one ``choose`` in microseconds: best of ``repeats`` passes.

    CPU time of this thread, not wall time, and the best pass, so other processes on a shared
    machine disturb the figure as little as possible. A warm-up pass fills the prefix index first.
    """
    router = Router(RoutingConfig(policy=policy, sample_size=sample_size), random.Random(1))
    for request in batch:
        router.choose(request, views, 0.0)
    best: tuple[float, float] | None = None
    for _ in range(repeats):
        durations_ns = []
        for request in batch:
            start_ns = time.thread_time_ns()
            router.choose(request, views, 0.0)
            durations_ns.append(time.thread_time_ns() - start_ns)
        durations_ns.sort()
        mean_us = statistics.fmean(durations_ns) / 1_000
        p99_us = durations_ns[int(len(durations_ns) * 0.99) - 1] / 1_000
        if best is None or mean_us < best[0]:
            best = (mean_us, p99_us)
    assert best is not None
    return best


def index_bytes_per_replica(capacity_blocks: int, replicas: int) -> float:
    hashes = [[hash((r, b)) for b in range(capacity_blocks)] for r in range(replicas)]
    tracemalloc.start()
    before, _ = tracemalloc.get_traced_memory()
    index = PrefixIndex(capacity_blocks)
    for r, chain in enumerate(hashes):
        index.record(f"replica-{r:04}", chain)
    after, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert all(index.size_blocks(f"replica-{r:04}") == capacity_blocks for r in range(replicas))
    return (after - before) / replicas


def main(argv: Sequence[str] | None = None) -> int:
    parser = benchmark_parser("routing", __doc__)
    parser.add_argument("--decisions", type=int, default=1_000, help="timed decisions per pass")
    parser.add_argument("--repeats", type=int, default=5, help="passes per case; the best is reported")
    parser.add_argument(
        "--capacity-blocks",
        type=int,
        default=28_125,
        help="blocks per replica (default: an H100 replica's 450k KV tokens)",
    )
    parser.add_argument(
        "--fleet-sizes",
        type=lambda text: tuple(int(n) for n in text.split(",")),
        default=FLEET_SIZES,
        help=f"replicas per fleet, comma-separated (default {','.join(map(str, FLEET_SIZES))})",
    )
    args = parser.parse_args(argv)
    with recorded(args.out):
        run(args.decisions, args.repeats, args.capacity_blocks, args.fleet_sizes)
    return 0


def run(decisions: int, repeats: int, capacity: int, fleet_sizes: Sequence[int]) -> None:
    rng = random.Random(0)
    batch = requests(decisions, rng)
    cases: list[tuple[str, PolicyName, int]] = [
        ("kvgate (sample 16)", "kvgate", 16),
        ("kvgate (exact)", "kvgate", 0),
        ("round_robin", "round_robin", 0),
        ("least_request", "least_request", 0),
    ]
    print(
        f"routing decision CPU time, best of {repeats} passes of {decisions} decisions "
        "(mean / p99, microseconds)"
    )
    print(f"{'policy':<22}" + "".join(f"{f'{n} replicas':>22}" for n in fleet_sizes))
    views_by_size = {size: fleet(size, rng) for size in fleet_sizes}
    for label, policy, sample_size in cases:
        cells = []
        for size in fleet_sizes:
            mean_us, p99_us = time_decisions(policy, sample_size, views_by_size[size], batch, repeats)
            cells.append(f"{mean_us:9.1f} / {p99_us:8.1f}")
        print(f"{label:<22}" + "".join(f"{cell:>22}" for cell in cells))

    per_replica_bytes = index_bytes_per_replica(capacity, replicas=8)
    print(
        f"prefix index memory: {per_replica_bytes / 2**20:.2f} MiB per replica at {capacity} blocks "
        f"({per_replica_bytes / capacity:.0f} B per block); "
        f"{per_replica_bytes * 1_000 / 2**30:.2f} GiB for 1,000 replicas"
    )


if __name__ == "__main__":
    sys.exit(main())
