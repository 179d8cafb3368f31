"""The phases of the neighbours benchmark: small clients alone, and beside a huge prompt every 0.5 s,
alternated round after round through one gateway per checkout in front of the same replicas."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.harness.fleet import SimSpec, start_sim
from bench.harness.gateway import kvgate_command, start_gateway
from bench.harness.gateway_config import Model, Pool, gateway_config
from bench.harness.processes import children
from bench.harness.ready import wait_ready
from bench.neighbours.prompts import shaped_prompt
from kvgate.sim.ports import free_ports

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CLIENTS = 8
SMALL_BODY = orjson.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "Say hello in five words."}], "max_tokens": 2}
)
HUGE_EVERY_S = 0.5
SETTLE_S = 1.0
"""Between phases, not measured: the last huge prompt's work finishes before the next phase."""
WINDOW_TOKENS = 131_072
FITS_WINDOW_TOKENS = 1 << 22
FITS_KV_CAPACITY_TOKENS = 200_000
"""Under the huge prompt's ~260k tokens, so ``fits`` ends in admission's 400 after a full count."""
HEADERS = {"content-type": "application/json"}


@dataclass
class Phase:
    variant: str
    checkout: str
    round: int
    huge: bool
    shape: str = "words"
    latencies_s: list[float] = field(default_factory=list)
    small_statuses: Counter[int] = field(default_factory=Counter)
    huge_statuses: Counter[int | str] = field(default_factory=Counter)
    huge_latencies_s: list[float] = field(default_factory=list)


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _gateway_config(replica_urls: list[str], port: int, fits: bool) -> dict[str, Any]:
    """As ``kvgate up`` configures its gateway (admission on, kvgate routing, a text access log); with
    ``fits``, a window that takes the huge prompt and a KV cache that does not."""
    return gateway_config(
        Pool(
            replica_urls,
            name="sim",
            kv_capacity_tokens=FITS_KV_CAPACITY_TOKENS if fits else 450_000,
            max_sequences=256,
        ),
        port=port,
        model=Model(MODEL, max_model_len=FITS_WINDOW_TOKENS if fits else WINDOW_TOKENS),
        admission={"enabled": True, "max_active_sequences_per_replica": 256},
        auth={"enabled": False},
        routing={"policy": "kvgate"},
        access_log={"format": "text"},
    )


def _profiler(py_spy_out: str | None) -> list[str]:
    """py-spy in front of a command (raw stacks of the threads holding the GIL) when ``py_spy_out``
    names its output."""
    if not py_spy_out:
        return []
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return [py_spy, "record", "-o", py_spy_out, "-f", "raw", "--gil", "--threads", "-r", "500", "--"]


def _source(checkout: Path) -> dict[str, str]:
    """The environment that runs ``checkout``'s sources (with ``cwd=checkout``)."""
    return {**os.environ, "PYTHONPATH": str(checkout)}


async def _small_client(session: aiohttp.ClientSession, url: str, phase: Phase, until_s: float) -> None:
    while time.monotonic() < until_s:
        start = time.monotonic()
        async with session.post(url, data=SMALL_BODY, headers=HEADERS) as response:
            await response.read()
        phase.latencies_s.append(time.monotonic() - start)
        phase.small_statuses[response.status] += 1


async def _huge_one(session: aiohttp.ClientSession, url: str, body: bytes, phase: Phase) -> None:
    start = time.monotonic()
    try:
        async with session.post(url, data=body, headers=HEADERS) as response:
            await response.read()
        phase.huge_statuses[response.status] += 1
    except aiohttp.ClientError as exc:
        phase.huge_statuses[type(exc).__name__] += 1
    phase.huge_latencies_s.append(time.monotonic() - start)


async def _huge_sender(
    session: aiohttp.ClientSession, url: str, body: bytes, phase: Phase, until_s: float
) -> None:
    sent: list[asyncio.Task[None]] = []
    next_s = time.monotonic()
    while next_s < until_s:
        sent.append(asyncio.create_task(_huge_one(session, url, body, phase)))
        next_s += HUGE_EVERY_S
        await asyncio.sleep(max(0.0, next_s - time.monotonic()))
    await asyncio.gather(*sent)


async def _phase(
    small: aiohttp.ClientSession,
    huge: aiohttp.ClientSession,
    url: str,
    huge_body: bytes | None,
    phase: Phase,
    phase_s: float,
) -> None:
    until_s = time.monotonic() + phase_s
    work = [_small_client(small, url, phase, until_s) for _ in range(CLIENTS)]
    if huge_body is not None:
        work.append(_huge_sender(huge, url, huge_body, phase, until_s))
    await asyncio.gather(*work)
    await asyncio.sleep(SETTLE_S)


def _describe(phase: Phase) -> str:
    p50_ms, p99_ms = (quantile(phase.latencies_s, q) * 1e3 for q in (0.5, 0.99))
    line = (
        f"{phase.variant:<5} {phase.shape:<11} {phase.checkout:<8} {'huge' if phase.huge else 'quiet':<6} "
        f"small n={len(phase.latencies_s):>5} "
        f"p50 {p50_ms:6.1f} ms p99 {p99_ms:6.1f} ms"
    )
    if phase.huge:
        statuses = ", ".join(f"{n} x {s}" for s, n in sorted(phase.huge_statuses.items(), key=str))
        line += f"; huge {statuses}, p50 {quantile(phase.huge_latencies_s, 0.5) * 1e3:.0f} ms"
    return line


async def run(
    checkouts: list[Path],
    rounds: int,
    phase_s: float,
    variant: str,
    size_bytes: int,
    py_spy_out: str | None,
    out: Path,
    up: bool = False,
    shape: str = "words",
) -> list[Phase]:
    fits = variant == "fits"
    prompt = shaped_prompt(shape, size_bytes)
    huge_body = orjson.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 8}
    )
    replicas = 2
    names = [checkout.name or str(checkout) for checkout in checkouts]
    phases: list[Phase] = []
    with children() as started:
        sim = None if up else start_sim(started, SimSpec(replicas, model=MODEL))
        replica_urls = list(sim.urls) if sim else []
        urls = []
        gateways = []
        for i, checkout in enumerate(checkouts):
            port = free_ports()
            wrapper = _profiler(py_spy_out if i == 0 else None)
            if up:
                command = kvgate_command("up", "--no-autoscale", "--replicas", "2", "--port", str(port))
                process = started.start([*wrapper, *command], cwd=checkout, env=_source(checkout))
            else:
                config = _gateway_config(replica_urls, port, fits)
                config_path = out / f"gateway-{variant}-{shape}-{i}.yaml"
                process = start_gateway(
                    started, config, config_path, cwd=checkout, env=_source(checkout), wrapper=wrapper
                ).process
            gateways.append(process)
            urls.append(f"http://127.0.0.1:{port}")
        connector = aiohttp.TCPConnector(limit=0)
        async with (
            aiohttp.ClientSession(connector=connector) as small,
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as huge,
        ):
            if sim is not None:
                await sim.ready(small)
            for url, process in zip(urls, gateways, strict=True):
                await wait_ready(small, url + "/readyz", process)
            print(
                f"{replicas} simulated replicas (time scale 1); {len(urls)} gateway(s): "
                + ", ".join(f"{n} ({c})" for n, c in zip(names, checkouts, strict=True))
                + f"; {CLIENTS} small clients; huge prompt {len(huge_body) / 1e6:.2f} MB every "
                f"{HUGE_EVERY_S:g} s, {shape}, {'fits the context' if fits else 'over the context'}; "
                f"{rounds} rounds of {phase_s:g} s phases",
                flush=True,
            )
            for name, url in zip(names, urls, strict=True):
                warm_up = Phase(variant, name, 0, False, shape)
                await _phase(small, huge, url + "/v1/chat/completions", None, warm_up, 2.0)
            for i in range(rounds):
                for name, url in zip(names, urls, strict=True):
                    for with_huge in (False, True) if i % 2 == 0 else (True, False):
                        phase = Phase(variant, name, i, with_huge, shape)
                        body = huge_body if with_huge else None
                        await _phase(small, huge, url + "/v1/chat/completions", body, phase, phase_s)
                        phases.append(phase)
                        print(f"round {i + 1}/{rounds} {_describe(phase)}", flush=True)
        if py_spy_out:
            gateways[0].send_signal(signal.SIGINT)
            gateways[0].wait(60)
    return phases


def summarize(phases: list[Phase]) -> None:
    """Small-request p50/p99 per gateway and phase over all rounds, and the p99 the huge prompts add:
    over all rounds, and the median of each round's own difference (huge minus quiet, next to each
    other in time), which a burst of load from outside the run moves far less."""
    print(
        f"\n{'variant':<8} {'shape':<12} {'gateway':<10} {'phase':<6} {'small n':>8} {'p50 ms':>7} "
        f"{'p99 ms':>7} {'added p99 ms':>13} {'per round, median':>18}"
    )
    for variant, shape, name in dict.fromkeys((p.variant, p.shape, p.checkout) for p in phases):
        mine = [p for p in phases if (p.variant, p.shape, p.checkout) == (variant, shape, name)]
        quiet = [x for p in mine if not p.huge for x in p.latencies_s]
        huge = [x for p in mine if p.huge for x in p.latencies_s]
        added_ms = (quantile(huge, 0.99) - quantile(quiet, 0.99)) * 1e3
        per_round_ms = [
            (quantile(h.latencies_s, 0.99) - quantile(q.latencies_s, 0.99)) * 1e3
            for q in mine
            for h in mine
            if not q.huge and h.huge and q.round == h.round
        ]
        for label, values in (("quiet", quiet), ("huge", huge)):
            extra = f"{added_ms:>+13.1f} {statistics.median(per_round_ms):>+18.1f}" if label == "huge" else ""
            print(
                f"{variant:<8} {shape:<12} {name:<10} {label:<6} {len(values):>8} "
                f"{quantile(values, 0.5) * 1e3:>7.1f} {quantile(values, 0.99) * 1e3:>7.1f} {extra}"
            )
    errors = Counter(s for p in phases for s in p.small_statuses.elements() if s != 200)
    if errors:
        print(f"small requests not answered 200: {dict(errors)}")
