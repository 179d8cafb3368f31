"""Router CPU per request: kvgate against the Rust routers, over the same zero-delay backends.

The backends of ``bench.proxy.backends`` (one process, four ports, answering at once) sit behind
every target at the same time: kvgate's gateway process (admission and routing on, configured as
for the other scenarios) and each peer router (``bench.harness.peers``: ``vllm-router`` and
``sglang-router`` from the ``bench`` extra, started with ``--worker-urls``). For each workload the
targets are measured in turn, round after round (A, B, C, A, B, C, ...), so a quieter or busier
moment of this shared machine lands on all of them alike; each round warms the target first, then
reads its process's CPU seconds (with its children's) over ``--requests`` requests at the same
concurrency from this driver. The load is a closed loop of ``--concurrency`` keep-alive
connections from a minimal HTTP/1.1 client (``bench.proxy.closed_loop``: on two shared cores an
aiohttp client costs several times a Rust router's CPU per request, which throttles what it offers;
``--driver aiohttp`` gives the figures taken with it before). The table gives each target's median
over the rounds of its CPU per request, requests per second and p99 time to the first chunk, and
each one's ratio to ``vllm:round_robin``'s in the same run.

    python -m bench proxy --peers all [--rounds 3] [--requests 4000] [--streams 600]
        [--peer-bin-dir /path/to/venv/bin] [--kvgate-from NAME=DIR ...] [--driver raw|aiohttp]

``--kvgate-from compiled=../kvgate-compiled`` adds a gateway run from another checkout (a compiled
build, another commit: ``python -m kvgate serve`` started in DIR runs DIR's code) to the same
rotation, with the same configuration: a change's cost measured alternately with the code before it
and the routers, on the same backends.

The pace rides in the prompt, not in a header: sglang-router forwards neither unknown headers nor
unknown body fields, and its streams would otherwise come back to back.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
import psutil

from bench.harness import peers
from bench.harness.gateway import start_gateway
from bench.harness.processes import children
from bench.proxy.closed_loop import LoopResult, closed_loop
from bench.proxy.load import drive
from bench.proxy.stage import CHAT_PATH, CHUNKS, MODEL, PACE_PROMPT_PREFIX, config, start_backends
from kvgate.sim.ports import free_ports

BASELINE = "vllm:round_robin"

WORKLOADS: tuple[tuple[str, bool, float], ...] = (
    ("non-stream", False, 0.0),
    (f"stream {CHUNKS} chunks, back to back", True, 0.0),
    (f"stream {CHUNKS} chunks, 5 ms apart", True, 5.0),
)
"""(name, stream, ms between chunks)."""


@dataclass(frozen=True, slots=True)
class Round:
    """One target's figures over one round of one workload."""

    cpu_ms: float
    """CPU milliseconds per request of the target's process tree."""
    per_s: float
    """Requests answered per second through the target."""
    ttfc_p99_ms: float
    """99th percentile of the time to the answer's first body bytes (a stream's first chunk)."""
    p99_ms: float


@dataclass(slots=True)
class Target:
    name: str
    url: str
    process: psutil.Process
    rounds: dict[str, list[Round]] = field(default_factory=dict)
    """Per workload, each round's figures."""

    @property
    def cpu_ms(self) -> dict[str, list[float]]:
        """Per workload, CPU milliseconds per request in each round."""
        return {name: [r.cpu_ms for r in rounds] for name, rounds in self.rounds.items()}

    def cpu_seconds(self) -> float:
        total = 0.0
        for proc in (self.process, *self.process.children(recursive=True)):
            try:
                times = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total


async def measure(
    targets: Sequence[Target],
    rounds: int,
    requests: int,
    streams: int,
    concurrency: int,
    driver: str = "raw",
) -> None:
    """Each workload, each target in turn per round: a closed loop of ``concurrency`` connections
    from the minimal keep-alive client (``driver`` raw, ``bench.proxy.closed_loop``) or from an
    aiohttp session (``driver`` aiohttp, as the figures before it were taken)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one_loop(url: str, body: bytes, headers: dict[str, str], total: int) -> LoopResult:
            if driver == "raw":
                return await closed_loop(url, body, headers, total, concurrency)
            result = await drive(session, url, body, headers, total, concurrency)
            return LoopResult(result.latencies_s, [], result.wall_s)

        for name, stream, pace_ms in WORKLOADS:
            total = streams if stream else requests
            body = orjson.dumps(
                {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"{PACE_PROMPT_PREFIX}{pace_ms:g}"}],
                    "max_tokens": CHUNKS,
                    "stream": stream,
                }
            )
            headers = {"content-type": "application/json"}
            for round_number in range(1, rounds + 1):
                for target in targets:
                    url = target.url + CHAT_PATH
                    await one_loop(url, body, headers, concurrency * 2)
                    before = target.cpu_seconds()
                    result = await one_loop(url, body, headers, total)
                    measured = Round(
                        (target.cpu_seconds() - before) * 1000 / total,
                        result.per_s(),
                        result.ttfc(0.99) * 1000,
                        result.p(0.99) * 1000,
                    )
                    target.rounds.setdefault(name, []).append(measured)
                    print(
                        f"  {name:<34} round {round_number}/{rounds}  {target.name:<20} "
                        f"{measured.cpu_ms:6.3f} ms CPU/request {measured.per_s:7.0f}/s  "
                        f"TTFC p99 {measured.ttfc_p99_ms:6.1f} ms  p50 {result.p(0.5) * 1000:6.1f} ms",
                        flush=True,
                    )


def print_table(targets: Sequence[Target], concurrency: int) -> None:
    """Per workload and target, the median over rounds of each figure (CPU with its min-max) and its
    ratio to ``BASELINE``'s median in the same run."""
    baseline = next((t for t in targets if t.name == BASELINE), None)
    print(
        f"\nrouter CPU per request, concurrency {concurrency}, median of rounds (min-max); x: to {BASELINE}"
    )
    print(
        f"{'workload':<36}{'router':<22}{'CPU ms/request':>22}{'x':>7}{'req/s':>9}{'x':>7}"
        f"{'TTFC p99 ms':>13}{'x':>7}"
    )
    for name, _, _ in WORKLOADS:
        for target in targets:
            rounds = target.rounds[name]
            cpu = [r.cpu_ms for r in rounds]
            spread = f"{statistics.median(cpu):.3f} ({min(cpu):.3f}-{max(cpu):.3f})"
            cells = [f"{spread:>22}"]
            for figure in ("cpu_ms", "per_s", "ttfc_p99_ms"):
                mine = _median(rounds, figure)
                reference = _median(baseline.rounds[name], figure) if baseline else float("nan")
                ratio = f"{mine / reference:.2f}x" if reference == reference and reference else "-"
                if figure != "cpu_ms":
                    cells.append(f"{mine:>9.0f}" if figure == "per_s" else f"{mine:>13.1f}")
                cells.append(f"{ratio:>7}")
            print(f"{name:<36}{target.name:<22}{''.join(cells)}")


def _median(rounds: Sequence[Round], figure: str) -> float:
    return float(statistics.median(getattr(r, figure) for r in rounds))


def kvgate_checkouts(specs: Sequence[str]) -> list[tuple[str, Path | None]]:
    """The gateways to run: this checkout's as ``kvgate``, then each ``NAME=DIR`` of
    ``--kvgate-from``. A DIR that holds no checkout, or a NAME another target has (the baseline's
    above all, whose figures every ratio divides by), is refused here, before anything starts."""
    gateways: list[tuple[str, Path | None]] = [("kvgate", None)]
    for spec in specs:
        name, sep, directory = spec.partition("=")
        path = Path(directory)
        if not sep or not name or not (path / "kvgate" / "__main__.py").is_file():
            raise ValueError(f"--kvgate-from {spec!r}: want NAME=DIR, DIR a kvgate checkout")
        if name in {existing for existing, _ in gateways} | {peer.name for peer in peers.PEERS}:
            raise ValueError(f"--kvgate-from {spec!r}: {name} already names a target")
        gateways.append((name, path.resolve()))
    return gateways


async def compare(args: argparse.Namespace) -> int:
    """The comparison ``python -m bench proxy --peers NAMES`` runs."""
    chosen = peers.select(args.peers)
    try:
        gateways = kvgate_checkouts(args.kvgate_from)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    with children() as started:
        backend_ports = start_backends(started)
        kvgates = {
            name: start_gateway(
                started, config(backend_ports, free_ports()), args.out / f"gateway-{name}.yaml", cwd=checkout
            )
            for name, checkout in gateways
        }
        targets = [Target(name, gw.url, psutil.Process(gw.process.pid)) for name, gw in kvgates.items()]
        urls = [f"http://127.0.0.1:{port}" for port in backend_ports]
        async with aiohttp.ClientSession() as session:
            for gateway in kvgates.values():
                await gateway.ready(session)
            for peer in chosen:
                binary = peers.locate(peer.program, args.peer_bin_dir)
                if binary is None:
                    print(
                        f"{peer.name}: {peer.program} not found (pip install 'kvgate[bench]')",
                        file=sys.stderr,
                    )
                    return 2
                process, url = peers.start_peer(started, peer, binary, urls)
                why = await peers.ready(session, process, url)
                if why is not None:
                    print(f"{peer.name}: {why}", file=sys.stderr)
                    return 2
                targets.append(Target(peer.name, url, psutil.Process(process.pid)))
        print(f"targets: {', '.join(t.name for t in targets)}; {args.rounds} rounds each", flush=True)
        await measure(targets, args.rounds, args.requests, args.streams, args.concurrency, args.driver)
        print_table(targets, args.concurrency)
        return 0
