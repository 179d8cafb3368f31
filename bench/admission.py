"""Admission under sustained overload: kvgate against the same gateway with admission off.

Three processes: simulated replicas (``kvgate sim``, real time), the gateway (``kvgate serve``), and
this driver (aiohttp, open-loop Poisson arrivals at ``overload`` x the fleet's estimated capacity).
Each phase runs the same arrival schedule through a fresh gateway in front of the same replicas:
first with admission on, then with ``admission.enabled: false``. A client that gets a 429 waits its
``retry-after-ms`` and tries again (up to ``--retries`` times), saying which attempt it is, and stops
when told not to retry (``x-should-retry: false``), as the openai SDK does (``x-stainless-retry-count``;
``kvgate.loadtest.client``). Printed per phase: admitted
requests, p50/p95 TTFT of admitted streams, preemptions (the replicas' own
``vllm:num_preemptions_total``), 429s, the share of 429'd clients whose first retry succeeded, and
the Retry-After error: median of (first token of the request that finally got in - its first 429)
minus the first ``retry-after-ms``; positive means the hint was too short. Errors are non-200/429
answers and dropped connections (each printed), counted rather than ending the run. Not a test.

    python -m bench admission [--duration-s 20] [--overload 2.0] [--replicas 2]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.harness import overload
from bench.harness.cli import benchmark_parser, recorded
from bench.harness.fleet import serve_sim
from bench.harness.gateway import serve_gateway
from bench.harness.gateway_config import gateway_config
from bench.harness.processes import children
from kvgate.loadtest.client import RetryPolicy, parse_retry_after_s, retry_wait_s, should_retry
from kvgate.sim.ports import free_ports

SDK = RetryPolicy()
RNG = random.Random(0)
"""The back-off's jitter when a 429 carries no wait the client honours."""


@dataclass(slots=True)
class Outcome:
    ttft_s: float | None = None
    rejects: int = 0
    first_retry_ok: bool | None = None
    predicted_wait_s: float | None = None
    actual_wait_s: float | None = None
    failed: bool = False


@dataclass(slots=True)
class Phase:
    name: str
    outcomes: list[Outcome] = field(default_factory=list)
    preemptions: float = 0.0


async def _one(session: aiohttp.ClientSession, url: str, prompt: str, retries: int) -> Outcome:
    outcome = Outcome()
    try:
        await _attempts(session, url, prompt, retries, outcome)
    except aiohttp.ClientError as exc:
        print(f"request failed: {exc!r}", file=sys.stderr)
        outcome.failed = True
    return outcome


async def _attempts(
    session: aiohttp.ClientSession, url: str, prompt: str, retries: int, outcome: Outcome
) -> None:
    body = overload.body(prompt)
    first_reject_s: float | None = None
    for attempt in range(retries + 1):
        start = time.monotonic()
        # As the openai SDKs do: the attempt count tells a retry from a new request with the same body.
        headers = {"x-stainless-retry-count": str(attempt)}
        async with session.post(url + "/v1/completions", json=body, headers=headers) as response:
            if response.status == 429:
                await response.read()
                # The openai SDK's reading of the answer (``kvgate.loadtest.client``).
                now_epoch_s = time.time()
                header_s = parse_retry_after_s(response.headers, now_epoch_s)
                wait_s = retry_wait_s(SDK, attempt, header_s, RNG)
                outcome.rejects += 1
                if first_reject_s is None:
                    first_reject_s = start
                    outcome.predicted_wait_s = wait_s
                if attempt == retries or not should_retry(429, response.headers, SDK, now_epoch_s):
                    return
                await asyncio.sleep(wait_s)
                continue
            if response.status != 200:
                await response.read()
                outcome.failed = True
                return
            async for _ in response.content.iter_any():
                if outcome.ttft_s is None:
                    outcome.ttft_s = time.monotonic() - start
                    if first_reject_s is not None:
                        outcome.actual_wait_s = time.monotonic() - first_reject_s
                        outcome.first_retry_ok = attempt == 1
        return


def _config(
    replica_urls: list[str], port: int, admission: bool, max_queue_wait_s: float
) -> dict[str, object]:
    return gateway_config(
        overload.pool(replica_urls),
        port=port,
        health={"interval_s": 0.5},
        admission={"enabled": admission, "max_queue_wait_s": max_queue_wait_s},
    )


async def _phase(
    name: str,
    admission: bool,
    replica_urls: list[str],
    arrivals_s: list[float],
    prompts: list[str],
    retries: int,
    max_queue_wait_s: float,
    out: Path,
) -> Phase:
    """The schedule through a fresh gateway in front of ``replica_urls``."""
    phase = Phase(name)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    config = _config(replica_urls, free_ports(), admission, max_queue_wait_s)
    with children() as started:
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            gateway = await serve_gateway(
                started, session, config, out / f"gateway-{name.replace(' ', '-')}.yaml"
            )
            url = gateway.url
            before = await overload.preemptions(session, replica_urls)
            start = time.monotonic()
            tasks = []
            for at_s, prompt in zip(arrivals_s, prompts, strict=True):
                delay = start + at_s - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(_one(session, url, prompt, retries)))
            phase.outcomes = list(await asyncio.gather(*tasks))
            phase.preemptions = await overload.preemptions(session, replica_urls) - before
    return phase


def _q(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _report(phase: Phase) -> str:
    admitted = [o for o in phase.outcomes if o.ttft_s is not None]
    ttfts = [o.ttft_s for o in admitted if o.ttft_s is not None]
    rejected = [o for o in phase.outcomes if o.predicted_wait_s is not None]
    retried = [o for o in rejected if o.first_retry_ok is not None or o.rejects > 1]
    first_ok = sum(1 for o in rejected if o.first_retry_ok)
    errors = [
        o.actual_wait_s - o.predicted_wait_s
        for o in rejected
        if o.actual_wait_s is not None and o.predicted_wait_s is not None
    ]
    first_ok_pct = 100.0 * first_ok / len(retried) if retried else float("nan")
    return (
        f"{phase.name:<14} {len(phase.outcomes):>6} {len(admitted):>8} "
        f"{_q(ttfts, 0.5):>9.3f} {_q(ttfts, 0.95):>9.3f} "
        f"{phase.preemptions:>11.0f} {sum(o.rejects for o in phase.outcomes):>8} {first_ok_pct:>14.1f} "
        f"{statistics.median(errors) if errors else float('nan'):>14.3f} "
        f"{sum(1 for o in phase.outcomes if o.failed):>7}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("admission", __doc__)
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--overload", type=float, default=2.0)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--retries", type=int, default=3)
    parser.add_argument("--max-queue-wait-s", type=float, default=2.0, help="admission.max_queue_wait_s")
    parser.add_argument("--itl-s", type=float, default=0.012, help="assumed decode step at full batch")
    parser.add_argument("--time-scale", type=float, default=1.0, help="the simulator's (default 1)")
    args = parser.parse_args(argv)
    with recorded(args.out):
        asyncio.run(run(args))
    return 0


async def run(args: argparse.Namespace) -> None:
    """The same arrivals through kvgate with admission on, then off, in front of one fleet."""
    replicas, duration_s, out = args.replicas, args.duration_s, args.out
    kv_tokens = overload.PROMPT_WORDS + overload.MAX_TOKENS
    capacity_per_s = overload.capacity_per_s(replicas, args.itl_s)
    rate_per_s = args.overload * capacity_per_s
    rng = random.Random(0)
    arrivals_s: list[float] = []
    t = 0.0
    while t < duration_s:
        t += rng.expovariate(rate_per_s)
        arrivals_s.append(t)
    prompts = [overload.prompt(rng) for _ in arrivals_s]
    spec = overload.sim_spec(replicas, args.time_scale)
    with children() as started:
        async with aiohttp.ClientSession() as session:
            replica_urls = list((await serve_sim(started, session, spec, output=None)).urls)
        print(
            f"{replicas} simulated replicas (KV {overload.KV_CAPACITY_TOKENS} tokens, "
            f"{overload.MAX_NUM_SEQS} seqs, "
            f"time scale {args.time_scale:g}), "
            f"~{kv_tokens} KV tokens per request, capacity ~{capacity_per_s:.1f} req/s, offered "
            f"{rate_per_s:.1f} req/s ({args.overload}x) for {duration_s:.0f} s; "
            f"sim, gateway and driver in separate processes"
        )
        phases = [
            await _phase(
                name, enabled, replica_urls, arrivals_s, prompts, args.retries, args.max_queue_wait_s, out
            )
            for name, enabled in (("kvgate", True), ("admission off", False))
        ]
    print(
        f"{'phase':<14} {'sent':>6} {'admitted':>8} {'ttft p50':>9} {'ttft p95':>9} {'preemptions':>11} "
        f"{'429s':>8} {'1st retry ok %':>14} {'RA late p50 s':>14} {'errors':>7}"
    )
    for phase in phases:
        print(_report(phase))


if __name__ == "__main__":
    sys.exit(main())
