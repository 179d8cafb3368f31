"""Benchmark: what one huge prompt being counted adds to the latency of small requests beside it.

Three kinds of process: simulated replicas (``kvgate sim``, real time), one gateway per checkout
(``kvgate serve`` on uvloop, configured as ``kvgate up`` configures it: admission on, kvgate routing,
a text access log), and this driver. Eight closed-loop clients send short chats (``max_tokens`` 8)
while two phases alternate: quiet (the small clients alone) and huge (a ~1 MB chat prompt every
0.5 s beside them). By default the huge prompt is over the model's 128k-token context, so it ends
in a 400 (``over``); with ``--fits`` the model's window is made large enough and the pool's KV
capacity too small for it, so it is counted in full and then refused by admission (``fits``).

``--checkout DIR`` (repeatable) runs a gateway from each source tree, all of them at once in front of
the same replicas, and drives them in turn, round after round (A quiet, A huge, B quiet, B huge, A
quiet, ...), so an old and a new gateway are compared in one run on one machine; e.g. with
``git archive main | tar -x -C /tmp/old``. Prints each phase as it ends, then small-request p50/p99
per checkout and phase and the p99 the huge prompts add. ``--py-spy FILE`` records the (first)
gateway with py-spy, for finding where the added latency comes from.

    python -m loadtest.bench_neighbours [--rounds 4] [--phase-s 5] [--fits] [--checkout DIR ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson

from loadtest.bench_tokenize import make_prompt
from loadtest.client import wait_until_ok
from loadtest.ports import free_ports
from loadtest.processes import processes

KVGATE = str(Path(sys.executable).parent / "kvgate")
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
"""Under the huge prompt's ~275k tokens, so ``--fits`` ends in admission's 400 after a full count."""
HEADERS = {"content-type": "application/json"}


@dataclass
class Phase:
    checkout: str
    huge: bool
    latencies_s: list[float] = field(default_factory=list)
    small_statuses: Counter[int] = field(default_factory=Counter)
    huge_statuses: Counter[int | str] = field(default_factory=Counter)
    huge_latencies_s: list[float] = field(default_factory=list)


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _gateway_config(replica_urls: list[str], port: int, fits: bool) -> dict[str, object]:
    return {
        "server": {"host": "127.0.0.1", "port": port, "drain_delay_s": 0},
        "models": [
            {
                "name": MODEL,
                "max_model_len": FITS_WINDOW_TOKENS if fits else WINDOW_TOKENS,
                "kv_bytes_per_token": 131072,
            }
        ],
        "pools": [
            {
                "name": "sim",
                "replicas": replica_urls,
                "kv_capacity_tokens": FITS_KV_CAPACITY_TOKENS if fits else 450_000,
                "max_sequences": 256,
            }
        ],
        "admission": {"enabled": True, "auth_enabled": False, "max_active_sequences_per_replica": 256},
        "routing": {"policy": "kvgate"},
        "access_log": {"format": "text"},
    }


def _start_gateway(
    checkout: Path, config: dict[str, object], config_dir: Path, py_spy_out: str | None
) -> subprocess.Popen[bytes]:
    path = config_dir / f"gateway-{len(list(config_dir.iterdir()))}.json"
    path.write_bytes(orjson.dumps(config))
    command = [KVGATE, "serve", "--config", str(path), "--log-level", "warning"]
    if py_spy_out:
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        command = [
            py_spy,
            "record",
            "-o",
            py_spy_out,
            "-f",
            "raw",
            "--gil",
            "--threads",
            "-r",
            "500",
            "--",
            *command,
        ]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    return subprocess.Popen(
        command, cwd=checkout, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def _start_up(checkout: Path, port: int, py_spy_out: str | None) -> subprocess.Popen[bytes]:
    command = [KVGATE, "up", "--no-autoscale", "--replicas", "2", "--port", str(port)]
    if py_spy_out:
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        command = [
            py_spy,
            "record",
            "-o",
            py_spy_out,
            "-f",
            "raw",
            "--gil",
            "--threads",
            "-r",
            "500",
            "--",
            *command,
        ]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    return subprocess.Popen(
        command, cwd=checkout, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


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
        f"{phase.checkout:<10} {'huge' if phase.huge else 'quiet':<6} small n={len(phase.latencies_s):>5} "
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
    fits: bool,
    size_bytes: int,
    py_spy_out: str | None,
    up: bool = False,
) -> list[Phase]:
    prompt = make_prompt(size_bytes)
    huge_body = orjson.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 8}
    )
    replicas = 2
    sim_port = free_ports(replicas + 1)
    replica_urls = [f"http://127.0.0.1:{sim_port + i}" for i in range(replicas)]
    sim = [KVGATE, "sim", "--replicas", str(replicas), "--port", str(sim_port)]
    sim += ["--cold-start-s", "0", "--control-port", str(sim_port + replicas), "--model", MODEL]
    names = [checkout.name or str(checkout) for checkout in checkouts]
    phases: list[Phase] = []
    with processes() as started, tempfile.TemporaryDirectory() as config_dir:
        started.append(subprocess.Popen(sim, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        urls = []
        for i, checkout in enumerate(checkouts):
            port = free_ports()
            config = _gateway_config(replica_urls, port, fits)
            spy = py_spy_out if i == 0 else None
            if up:
                started.append(_start_up(checkout, port, spy))
            else:
                started.append(_start_gateway(checkout, config, Path(config_dir), spy))
            urls.append(f"http://127.0.0.1:{port}")
        connector = aiohttp.TCPConnector(limit=0)
        async with (
            aiohttp.ClientSession(connector=connector) as small,
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as huge,
        ):
            for url in [*replica_urls, *urls]:
                await wait_until_ok(small, url + ("/readyz" if url in urls else "/health"))
            print(
                f"{replicas} simulated replicas (time scale 1); {len(urls)} gateway(s): "
                + ", ".join(f"{n} ({c})" for n, c in zip(names, checkouts, strict=True))
                + f"; {CLIENTS} small clients; huge prompt {len(huge_body) / 1e6:.2f} MB every "
                f"{HUGE_EVERY_S:g} s, {'fits the context' if fits else 'over the context'}; "
                f"{rounds} rounds of {phase_s:g} s phases",
                flush=True,
            )
            for name, url in zip(names, urls, strict=True):
                await _phase(small, huge, url + "/v1/chat/completions", None, Phase(name, False), 2.0)
            for i in range(rounds):
                for name, url in zip(names, urls, strict=True):
                    for with_huge in (False, True) if i % 2 == 0 else (True, False):
                        phase = Phase(name, with_huge)
                        body = huge_body if with_huge else None
                        await _phase(small, huge, url + "/v1/chat/completions", body, phase, phase_s)
                        phases.append(phase)
                        print(f"round {i + 1}/{rounds} {_describe(phase)}", flush=True)
        if py_spy_out:
            with contextlib.suppress(IndexError):
                started[1].send_signal(2)
                started[1].wait(60)
    return phases


def summarize(phases: list[Phase]) -> None:
    print(f"\n{'gateway':<10} {'phase':<6} {'small n':>8} {'p50 ms':>8} {'p99 ms':>8} {'added p99 ms':>13}")
    for name in dict.fromkeys(p.checkout for p in phases):
        quiet = [x for p in phases if p.checkout == name and not p.huge for x in p.latencies_s]
        huge = [x for p in phases if p.checkout == name and p.huge for x in p.latencies_s]
        added_ms = (quantile(huge, 0.99) - quantile(quiet, 0.99)) * 1e3
        for label, values, extra in (("quiet", quiet, ""), ("huge", huge, f"{added_ms:>+13.1f}")):
            print(
                f"{name:<10} {label:<6} {len(values):>8} {quantile(values, 0.5) * 1e3:>8.1f} "
                f"{quantile(values, 0.99) * 1e3:>8.1f} {extra}"
            )
    errors = Counter(s for p in phases for s in p.small_statuses.elements() if s != 200)
    if errors:
        print(f"small requests not answered 200: {dict(errors)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--phase-s", type=float, default=5.0, help="seconds per phase")
    parser.add_argument("--fits", action="store_true", help="the huge prompt fits the model's context")
    parser.add_argument("--size-mb", type=float, default=1.0, help="huge prompt size (MB, 10^6 bytes)")
    parser.add_argument(
        "--checkout",
        action="append",
        type=Path,
        help="a source tree to run a gateway from (default: this one)",
    )
    parser.add_argument("--up", action="store_true", help="kvgate up (replicas in the gateway's process)")
    parser.add_argument("--py-spy", metavar="FILE", help="record the first gateway with py-spy into FILE")
    args = parser.parse_args()
    checkouts = [c.resolve() for c in args.checkout or [Path.cwd()]]
    phases = asyncio.run(
        run(checkouts, args.rounds, args.phase_s, args.fits, int(args.size_mb * 1e6), args.py_spy, args.up)
    )
    summarize(phases)


if __name__ == "__main__":
    main()
