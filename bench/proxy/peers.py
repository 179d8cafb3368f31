"""Router CPU per request: kvgate against the Rust routers, over the same zero-delay backends.

The backends of ``bench.proxy.backends`` (one process, four ports, answering at once) sit behind
every target at the same time: kvgate's gateway process (admission and routing on, configured as
for the other scenarios) and each peer router (``bench.harness.peers``: ``vllm-router`` and
``sglang-router`` from the ``bench`` extra, started with ``--worker-urls``). For each workload the
targets are measured in turn, round after round (A, B, C, A, B, C, ...), so a quieter or busier
moment of this shared machine lands on all of them alike; each round warms the target first, then
reads its process's CPU seconds (with its children's) over ``--requests`` requests at the same
concurrency from this driver. The table gives each target's median over the rounds and its ratio
to ``vllm:round_robin``'s in the same run.

    python -m bench proxy --peers all [--rounds 3] [--requests 4000] [--streams 600]
        [--peer-bin-dir /path/to/venv/bin] [--kvgate-from NAME=DIR ...]

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


@dataclass(slots=True)
class Target:
    name: str
    url: str
    process: psutil.Process
    cpu_ms: dict[str, list[float]] = field(default_factory=dict)
    """Per workload, CPU milliseconds per request in each round."""

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
    targets: Sequence[Target], rounds: int, requests: int, streams: int, concurrency: int
) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
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
                    await drive(session, url, body, headers, concurrency, concurrency)
                    before = target.cpu_seconds()
                    result = await drive(session, url, body, headers, total, concurrency)
                    per_request_ms = (target.cpu_seconds() - before) * 1000 / total
                    target.cpu_ms.setdefault(name, []).append(per_request_ms)
                    print(
                        f"  {name:<34} round {round_number}/{rounds}  {target.name:<20} "
                        f"{per_request_ms:6.3f} ms CPU/request  p50 {result.p(0.5) * 1000:6.1f} ms",
                        flush=True,
                    )


def print_table(targets: Sequence[Target], concurrency: int) -> None:
    baseline = next((t for t in targets if t.name == BASELINE), None)
    print(f"\nrouter CPU per request, concurrency {concurrency}, median of rounds (min-max)")
    print(f"{'workload':<36}{'router':<22}{'CPU ms/request':>22}{'ratio to ' + BASELINE:>30}")
    for name, _, _ in WORKLOADS:
        reference = statistics.median(baseline.cpu_ms[name]) if baseline else None
        for target in targets:
            values = target.cpu_ms[name]
            median = statistics.median(values)
            spread = f"{median:.3f} ({min(values):.3f}-{max(values):.3f})"
            ratio = f"{median / reference:.2f}x" if reference else "-"
            print(f"{name:<36}{target.name:<22}{spread:>22}{ratio:>30}")


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
        await measure(targets, args.rounds, args.requests, args.streams, args.concurrency)
        print_table(targets, args.concurrency)
        return 0
