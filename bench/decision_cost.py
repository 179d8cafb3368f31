"""What coordination and the ITL objective cost a request that fits: the admission decision with and
without claims, and with learned inter-token-latency limits.

In one process, on the real decision path (``DecisionPath``: ``Dispatcher.admit`` over the
``Fleet``'s snapshot, routing, the reservation, then ``Dispatcher.release``), one priced request is
admitted and released over and over, alternating rounds between a gateway alone (no coordination)
and a gateway holding claims as one of 2 and of 4 (its ``RedisCoordinator`` as after a good sync:
``foreign_loads`` is what lies outside its claims). No Redis is involved: by design a request that
fits its claim makes no round trip, so what is measured is all a coordinated request pays on the
hot path. A fourth setting is a gateway alone whose model has ``itl_slo_s``, every replica with a
learned limit above the load (``kvgate.admission.itl_guard``), so every room check reads it. Printed:
median and p99 microseconds per decision (admit + release) per setting, and the ratio to the
gateway alone, from the same run. Not a test.

    python -m bench decision_cost [--rounds 20] [--decisions 2000] [--replicas 8]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from typing import Any

import orjson

from bench.harness.cli import benchmark_parser, recorded
from bench.harness.gateway_config import Model, Pool, gateway_config
from kvgate.admission.claims import ClaimBook, Grant, Share, replica_capacity
from kvgate.config.loader import parse_config
from kvgate.gateway.coordination.coordinator import ClaimedLoads, RedisCoordinator
from kvgate.gateway.request_path.decision_path import DecisionPath
from kvgate.gateway.request_path.dispatcher import Route
from kvgate.gateway.state import GatewayState, ProxyRequest
from kvgate.gateway.telemetry.metrics import GatewayMetrics
from kvgate.routing.health import Outcome

KV_CAPACITY_TOKENS = 400_000
GUARD = 128


def _config(replicas: int, itl_slo_s: float | None) -> Any:
    admission = {} if itl_slo_s is None else {"models": {"m": {"itl_slo_s": itl_slo_s}}}
    urls = [f"http://10.0.0.{i + 1}:8000" for i in range(replicas)]
    tokenizer = {"kind": "bytes", "bytes_per_token": 4.0}
    return parse_config(
        gateway_config(
            Pool(urls, name="p", kv_capacity_tokens=KV_CAPACITY_TOKENS),
            model=Model("m", max_model_len=8192, kv_bytes_per_token=1, tokenizer=tokenizer),
            routing={"seed": 1, "warmup_s": 0},
            admission=admission,
        ),
        {},
    )


def _path(replicas: int, gateways: int, itl_slo_s: float | None) -> tuple[DecisionPath, GatewayState]:
    config = _config(replicas, itl_slo_s)
    state = GatewayState.from_config(config)
    metrics = GatewayMetrics(clock=time.monotonic, window_s=60.0)
    path = DecisionPath.build(state, config, metrics, time.monotonic)
    for replica in state.replicas.values():
        path.fleet.observe_outcome(replica, Outcome.SUCCESS)
    if gateways > 1:
        capacity = replica_capacity(KV_CAPACITY_TOKENS, 0, GUARD)
        share = Share(capacity.kv_tokens // gateways, capacity.sequences // gateways)
        coordinator = RedisCoordinator("redis://unused", dict, book=ClaimBook())
        coordinator.book.granted(
            {r: Grant(share, Share()) for r in state.replicas}, {r: capacity for r in state.replicas}
        )
        coordinator._foreign = ClaimedLoads(coordinator.book.others_load())
        coordinator.last_sync_s = time.monotonic() + 3600.0
        path.fleet.foreign_loads = coordinator.foreign_loads
    guard = path.dispatcher.controller.itl_guard
    if guard is not None:
        for replica in state.replicas.values():
            for sequences in range(1, 33):
                guard.observe(replica.replica_id, replica.models, sequences, 0.01 + 0.0005 * sequences)
        assert all(1 < limit < GUARD for limit in guard.limits.values()), guard.limits
    return path, state


async def _request(path: DecisionPath) -> ProxyRequest:
    body = {"model": "m", "prompt": "a question about coordination " * 20, "max_tokens": 256}
    raw = orjson.dumps(body)
    request = ProxyRequest("bench", "bench", "/v1/completions", "m", False, body, raw, [], [])
    request.arrived_s = time.monotonic()
    refusal = await path.pricer.price(request)
    assert refusal is None, refusal
    return request


async def _round(path: DecisionPath, request: ProxyRequest, decisions: int) -> list[float]:
    dispatcher = path.dispatcher
    samples = []
    for _ in range(decisions):
        request.tried.clear()
        start = time.perf_counter_ns()
        route = await dispatcher.admit(request)
        dispatcher.release(request)
        samples.append((time.perf_counter_ns() - start) / 1000.0)
        assert isinstance(route, Route), route
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("decision_cost", __doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--decisions", type=int, default=2000)
    parser.add_argument("--replicas", type=int, default=8)
    args = parser.parse_args(argv)
    with recorded(args.out):
        asyncio.run(run(args.rounds, args.decisions, args.replicas))
    return 0


async def run(rounds: int, decisions: int, replicas: int) -> None:
    settings: dict[str, tuple[int, float | None]] = {
        "1 gateway, no Redis": (1, None),
        "1 of 2 with claims": (2, None),
        "1 of 4 with claims": (4, None),
        "1 gateway, itl_slo_s": (1, 0.05),
    }
    paths = {name: _path(replicas, n, itl_slo_s) for name, (n, itl_slo_s) in settings.items()}
    requests = {name: await _request(path) for name, (path, _) in paths.items()}
    samples: dict[str, list[float]] = {name: [] for name in settings}
    for i in range(rounds):
        for name, (path, _) in paths.items():
            samples[name] += await _round(path, requests[name], decisions)
        print(f"round {i + 1}/{rounds}", file=sys.stderr)
    base = statistics.median(samples["1 gateway, no Redis"])
    runs = f"{rounds} x {decisions}"
    print(f"{replicas} replicas, {runs} decisions per setting, rounds alternated")
    print("| setting | admit + release p50 µs | p99 µs | p50 vs alone |")
    print("|---|---|---|---|")
    for name, values in samples.items():
        values.sort()
        p50, p99 = statistics.median(values), values[int(0.99 * (len(values) - 1))]
        print(f"| {name} | {p50:.1f} | {p99:.1f} | {p50 / base:.2f}x |")


if __name__ == "__main__":
    sys.exit(main())
