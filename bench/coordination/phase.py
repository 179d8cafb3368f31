"""One phase of the coordination benchmark: N gateways (sharing Redis claims or not) in front of the
fleet, the arrivals sent to them at random, and what the phase cost: CPU, syncs, preemptions, the
most requests admitted at once."""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis

from bench.harness import overload
from bench.harness.gateway import start_gateway
from bench.harness.gateway_config import gateway_config
from bench.harness.metrics import scrape
from bench.harness.processes import children
from bench.harness.ready import NotReady
from kvgate.sim.ports import free_ports

RESIDENT = "kvgate_resident_sequences"
TENANTS = {"a": "sk-bench-a", "b": "sk-bench-b"}
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(slots=True)
class Outcome:
    tenant: str
    ttft_s: float | None = None
    finished: bool = False
    rejects: int = 0
    first_retry_ok: bool | None = None
    itl_s: float | None = None
    """Mean seconds between output tokens, first to last."""


@dataclass(slots=True)
class Phase:
    name: str
    gateways: int
    coordinated: bool
    duration_s: float = 0.0
    window_s: float = 0.0
    """Seconds over which the requests arrived: goodput is per second of it."""
    outcomes: list[Outcome] = field(default_factory=list)
    preemptions: float = 0.0
    peak_admitted: int = 0
    gateway_cpu_s: float = 0.0
    redis_cpu_s: float = 0.0
    syncs: float = 0.0


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


async def _script_calls(redis_url: str) -> int:
    """Lua script calls Redis has served: one per gateway sync."""
    client = aioredis.from_url(redis_url)
    try:
        stats = await client.info("commandstats")
    finally:
        await client.aclose()
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "eval"))


async def _watch_gateways(
    session: aiohttp.ClientSession, urls: list[str], phase: Phase, stop: asyncio.Event
) -> None:
    """The most sequences all gateways had admitted at once, sampled every 0.25 s."""
    while not stop.is_set():
        pages = await asyncio.gather(*(scrape(session, url, (RESIDENT,)) for url in urls))
        admitted = sum(page.sum(RESIDENT) for page in pages)
        phase.peak_admitted = max(phase.peak_admitted, int(admitted))
        await asyncio.sleep(0.25)


async def _one(
    session: aiohttp.ClientSession,
    urls: list[str],
    rng: random.Random,
    prompt: str,
    tenant: str,
    retries: int,
) -> Outcome:
    outcome = Outcome(tenant)
    body = overload.body(prompt)
    first_s = time.monotonic()
    try:
        for attempt in range(retries + 1):
            headers = {"authorization": f"Bearer {TENANTS[tenant]}", "x-stainless-retry-count": str(attempt)}
            url = rng.choice(urls)
            async with session.post(url + "/v1/completions", json=body, headers=headers) as response:
                if response.status == 429:
                    await response.read()
                    outcome.rejects += 1
                    if attempt == retries:
                        return outcome
                    await asyncio.sleep(int(response.headers.get("retry-after-ms", "1000")) / 1000.0)
                    continue
                if response.status != 200:
                    await response.read()
                    return outcome
                first_token_s = last_s = 0.0
                async for _ in response.content.iter_any():
                    last_s = time.monotonic()
                    if outcome.ttft_s is None:
                        first_token_s = last_s
                        outcome.ttft_s = last_s - first_s
                        if attempt >= 1 and outcome.first_retry_ok is None:
                            outcome.first_retry_ok = attempt == 1
                outcome.itl_s = (last_s - first_token_s) / (overload.MAX_TOKENS - 1)
                outcome.finished = True
                return outcome
    except aiohttp.ClientError as exc:
        print(f"request failed: {exc!r}", file=sys.stderr)
    return outcome


def _config(replica_urls: list[str], port: int, redis_url: str | None, namespace: str) -> dict[str, Any]:
    config = gateway_config(
        overload.pool(replica_urls),
        port=port,
        health={"interval_s": 0.5},
        admission={
            "max_queue_wait_s": 2.0,
            "tenants": [{"name": name, "weight": 1} for name in TENANTS],
        },
        auth={"tenants": [{"name": name, "api_keys": [key]} for name, key in TENANTS.items()]},
    )
    if redis_url is not None:
        config["coordination"] = {"redis_url": redis_url, "namespace": namespace, "interval_s": 0.2}
    return config


async def run_phase(
    phase: Phase,
    replica_urls: list[str],
    redis_url: str,
    redis_pid: int,
    arrivals: list[tuple[float, str, str]],
    retries: int,
    out: Path,
) -> Phase:
    """The arrivals through ``phase.gateways`` fresh gateways, each request to one drawn at random."""
    namespace = f"bench-{phase.name.replace(' ', '-')}"
    rng = random.Random(1)
    connector = aiohttp.TCPConnector(limit=0)
    with children() as started:
        gateways = []
        for i in range(phase.gateways):
            config = _config(replica_urls, free_ports(), redis_url if phase.coordinated else None, namespace)
            name = f"gateway-{namespace}-{i}"
            log = out / f"{name}.log"
            gateways.append(
                start_gateway(started, config, out / f"{name}.yaml", log_level="info", output=log)
            )
        urls = [gateway.url for gateway in gateways]
        procs = [gateway.process for gateway in gateways]
        async with aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=600)
        ) as session:
            for i, gateway in enumerate(gateways):
                try:
                    await gateway.ready(session)
                except NotReady:
                    print((out / f"gateway-{namespace}-{i}.log").read_text()[-3000:], file=sys.stderr)
                    raise
            before = await overload.preemptions(session, replica_urls)
            cpu_before = sum(_cpu_s(p.pid) for p in procs)
            redis_before = _cpu_s(redis_pid)
            calls_before = await _script_calls(redis_url)
            stop = asyncio.Event()
            watcher = asyncio.create_task(_watch_gateways(session, urls, phase, stop))
            start = time.monotonic()
            tasks = []
            for at_s, prompt, tenant in arrivals:
                delay = start + at_s - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(_one(session, urls, rng, prompt, tenant, retries)))
                if len(tasks) % 50 == 0:
                    print(f"  {phase.name}: {len(tasks)}/{len(arrivals)} sent", file=sys.stderr)
            phase.outcomes = list(await asyncio.gather(*tasks))
            phase.duration_s = time.monotonic() - start
            phase.window_s = arrivals[-1][0]
            stop.set()
            await watcher
            phase.gateway_cpu_s = sum(_cpu_s(p.pid) for p in procs) - cpu_before
            phase.redis_cpu_s = _cpu_s(redis_pid) - redis_before
            after = await overload.preemptions(session, replica_urls)
            phase.preemptions = after - before
            phase.syncs = (await _script_calls(redis_url) - calls_before) / phase.duration_s
    return phase
