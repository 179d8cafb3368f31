"""Benchmark: what one huge prompt being counted adds to the latency of small requests beside it.

Three kinds of process: simulated replicas (``kvgate sim``, real time), one gateway per checkout
(``kvgate serve`` on uvloop, configured as ``kvgate up`` configures it: admission on, kvgate routing,
a text access log), and this driver. Eight closed-loop clients send short chats (``max_tokens`` 2)
while two phases alternate: quiet (the small clients alone) and huge (a 1 MB chat prompt every
0.5 s beside them). In ``--variant over`` the huge prompt is over the model's 128k-token context,
so it ends in a 400; in ``--variant fits`` the model's window is made large enough and the pool's
KV capacity too small for it, so it is counted in full and then refused by admission.

``--checkout DIR`` (repeatable) runs a gateway from each source tree, all of them at once in front of
the same replicas, and drives them in turn, round after round (A quiet, A huge, B quiet, B huge,
then A huge, A quiet, ...: the order flips each round so a drift favours no phase), so an old and a
new gateway are compared in one run on one machine; e.g. with ``git archive main | tar -x -C
/tmp/old``. Prints each phase as it ends, then small-request p50/p99 per checkout and phase and the
p99 the huge prompts add. ``--up`` runs ``kvgate up`` instead (the replicas in the gateway's own
process and event loop), as someone trying kvgate would. ``--py-spy FILE`` records the first
gateway with py-spy (raw stacks of the threads holding the GIL), to find where the time goes.

    python -m bench.bench_neighbours [--rounds 4] [--phase-s 5] [--variant over|fits|both]
        [--checkout DIR ...] [--up] [--py-spy FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.processes import processes
from bench.tokenize import make_prompt
from kvgate.loadtest.client import wait_until_ok
from kvgate.sim.ports import free_ports

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
"""Under the huge prompt's ~260k tokens, so ``fits`` ends in admission's 400 after a full count."""
HEADERS = {"content-type": "application/json"}


@dataclass
class Phase:
    variant: str
    checkout: str
    round: int
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


def _spawn(checkout: Path, command: list[str], py_spy_out: str | None) -> subprocess.Popen[bytes]:
    """``command`` run from ``checkout``'s sources; under py-spy (raw stacks of the threads holding
    the GIL) when ``py_spy_out`` names its output."""
    if py_spy_out:
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        profile = ["record", "-o", py_spy_out, "-f", "raw", "--gil", "--threads", "-r", "500", "--"]
        command = [py_spy, *profile, *command]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    return subprocess.Popen(
        command, cwd=checkout, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def _start_gateway(
    checkout: Path, config: dict[str, object], config_dir: Path, py_spy_out: str | None
) -> subprocess.Popen[bytes]:
    path = config_dir / f"gateway-{len(list(config_dir.iterdir()))}.json"
    path.write_bytes(orjson.dumps(config))
    return _spawn(checkout, [KVGATE, "serve", "--config", str(path), "--log-level", "warning"], py_spy_out)


def _start_up(checkout: Path, port: int, py_spy_out: str | None) -> subprocess.Popen[bytes]:
    return _spawn(
        checkout, [KVGATE, "up", "--no-autoscale", "--replicas", "2", "--port", str(port)], py_spy_out
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
        f"{phase.variant:<5} {phase.checkout:<8} {'huge' if phase.huge else 'quiet':<6} "
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
    up: bool = False,
) -> list[Phase]:
    fits = variant == "fits"
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
        if not up:
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
            for url in [*([] if up else replica_urls), *urls]:
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
                warm_up = Phase(variant, name, 0, False)
                await _phase(small, huge, url + "/v1/chat/completions", None, warm_up, 2.0)
            for i in range(rounds):
                for name, url in zip(names, urls, strict=True):
                    for with_huge in (False, True) if i % 2 == 0 else (True, False):
                        phase = Phase(variant, name, i, with_huge)
                        body = huge_body if with_huge else None
                        await _phase(small, huge, url + "/v1/chat/completions", body, phase, phase_s)
                        phases.append(phase)
                        print(f"round {i + 1}/{rounds} {_describe(phase)}", flush=True)
        if py_spy_out:
            profiled = started[0 if up else 1]
            profiled.send_signal(signal.SIGINT)
            profiled.wait(60)
    return phases


def summarize(phases: list[Phase]) -> None:
    """Small-request p50/p99 per gateway and phase over all rounds, and the p99 the huge prompts add:
    over all rounds, and the median of each round's own difference (huge minus quiet, next to each
    other in time), which a burst of load from outside the run moves far less."""
    print(
        f"\n{'variant':<8} {'gateway':<10} {'phase':<6} {'small n':>8} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'added p99 ms':>13} {'per round, median':>18}"
    )
    for variant, name in dict.fromkeys((p.variant, p.checkout) for p in phases):
        mine = [p for p in phases if p.variant == variant and p.checkout == name]
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
                f"{variant:<8} {name:<10} {label:<6} {len(values):>8} {quantile(values, 0.5) * 1e3:>7.1f} "
                f"{quantile(values, 0.99) * 1e3:>7.1f} {extra}"
            )
    errors = Counter(s for p in phases for s in p.small_statuses.elements() if s != 200)
    if errors:
        print(f"small requests not answered 200: {dict(errors)}")


async def _stalls(variant: str, prompts: int) -> list[float]:
    """In this process, on uvloop: the longest a 1 ms ticker oversleeps while the gateway's own prompt
    encoder counts each of ``prompts`` huge prompts (its body parsed on the loop first, as the proxy
    does, and its block hashes taken as pricing then does): how long a small request beside it can
    be held up. Uses only seams an older checkout has too (``PromptEncoder.encode`` returned the ids
    there, hashed by pricing on the loop), so each checkout's child runs its own code."""
    from kvgate.config.schema import Model
    from kvgate.gateway.request_path.prompt import PromptEncoder
    from kvgate.routing.prefix_hash import block_hashes

    window = FITS_WINDOW_TOKENS if variant == "fits" else WINDOW_TOKENS
    model = Model.model_validate({"name": MODEL, "max_model_len": window, "kv_bytes_per_token": 131072})
    encoder = PromptEncoder([model])
    raw = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": make_prompt(1_000_000)}]})
    lags_s: list[float] = []
    stop = asyncio.Event()

    async def tick() -> None:
        while not stop.is_set():
            start = time.perf_counter()
            await asyncio.sleep(0.001)
            lags_s.append(time.perf_counter() - start - 0.001)

    stalls_s = []
    async with aiohttp.ClientSession() as session:
        await encoder.encode(MODEL, {"model": MODEL, "prompt": "warm up"}, 7, session, "")
        ticker = asyncio.create_task(tick())
        for _ in range(prompts):
            await asyncio.sleep(0.05)
            lags_s.clear()
            body = orjson.loads(raw)
            counted: Any = await encoder.encode(MODEL, body, len(raw), session, "")
            blocks = tuple(block_hashes(counted)) if isinstance(counted, list) else counted.block_hashes
            del counted, blocks, body
            await asyncio.sleep(0.005)
            stalls_s.append(max(lags_s, default=0.0))
        stop.set()
        await ticker
    return stalls_s


def _lag_child(variant: str, prompts: int) -> None:
    import uvloop

    print(orjson.dumps(uvloop.run(_stalls(variant, prompts))).decode())


def loop_lag(checkouts: list[Path], rounds: int, prompts: int) -> None:
    """Each checkout's encoder in a child process of its own, alternated ``rounds`` times per variant;
    prints the stall per huge prompt (the ticker's longest oversleep while it is handled): median,
    p90 and max per checkout and variant."""
    print(f"event-loop stall per 1 MB prompt counted by the gateway's encoder, {prompts} prompts a child")
    stalls: dict[tuple[str, str], list[float]] = {}
    for i in range(rounds):
        for variant in ("over", "fits"):
            for checkout in checkouts:
                env = {**os.environ, "PYTHONPATH": str(checkout)}
                command = [sys.executable, __file__, "--lag-child", variant, "--prompts", str(prompts)]
                out = subprocess.run(command, cwd=checkout, env=env, capture_output=True, check=True).stdout
                these = orjson.loads(out.splitlines()[-1])
                stalls.setdefault((variant, checkout.name), []).extend(these)
                print(
                    f"round {i + 1}/{rounds} {variant:<5} {checkout.name:<8} stall median "
                    f"{statistics.median(these) * 1e3:6.2f} ms max {max(these) * 1e3:6.2f} ms",
                    flush=True,
                )
    print(f"\n{'variant':<8} {'gateway':<10} {'prompts':>7} {'median ms':>10} {'p90 ms':>7} {'max ms':>7}")
    for (variant, name), values in stalls.items():
        print(
            f"{variant:<8} {name:<10} {len(values):>7} {statistics.median(values) * 1e3:>10.2f} "
            f"{quantile(values, 0.9) * 1e3:>7.2f} {max(values) * 1e3:>7.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--phase-s", type=float, default=5.0, help="seconds per phase")
    parser.add_argument(
        "--variant",
        choices=("over", "fits", "both"),
        default="both",
        help="the huge prompt over the model's context, fitting it, or each in turn",
    )
    parser.add_argument("--size-mb", type=float, default=1.0, help="huge prompt size (MB, 10^6 bytes)")
    parser.add_argument(
        "--checkout",
        action="append",
        type=Path,
        help="a source tree to run a gateway from (default: this one)",
    )
    parser.add_argument("--up", action="store_true", help="kvgate up (replicas in the gateway's process)")
    parser.add_argument("--py-spy", metavar="FILE", help="record the first gateway with py-spy into FILE")
    parser.add_argument(
        "--loop-lag",
        action="store_true",
        help="instead: the event-loop stall per huge prompt counted by each checkout's encoder, in-process",
    )
    parser.add_argument("--prompts", type=int, default=10, help="--loop-lag: prompts per child")
    parser.add_argument("--lag-child", choices=("over", "fits"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.lag_child:
        _lag_child(args.lag_child, args.prompts)
        return
    if args.loop_lag:
        loop_lag([c.resolve() for c in args.checkout or [Path.cwd()]], args.rounds, args.prompts)
        return
    if args.up and args.variant != "over":
        parser.error("--up runs kvgate up's own model window: only --variant over")
    checkouts = [c.resolve() for c in args.checkout or [Path.cwd()]]
    phases = []
    for variant in ("over", "fits") if args.variant == "both" else (args.variant,):
        size_bytes = int(args.size_mb * 1e6)
        phases += asyncio.run(
            run(checkouts, args.rounds, args.phase_s, variant, size_bytes, args.py_spy, args.up)
        )
    summarize(phases)


if __name__ == "__main__":
    main()
