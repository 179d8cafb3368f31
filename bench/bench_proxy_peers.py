"""Router CPU per request: kvgate against the Rust routers, over the same zero-delay backends.

The backends of ``bench.bench_proxy`` (one process, four ports, answering at once) sit behind
every target at the same time: kvgate's gateway process (admission and routing on, as
``bench_proxy`` configures it) and each peer router (``bench.peers``: ``vllm-router`` and
``sglang-router`` from the ``bench`` extra, started with ``--worker-urls``). For each workload the
targets are measured in turn, round after round (A, B, C, A, B, C, ...), so a quieter or busier
moment of this shared machine lands on all of them alike; each round warms the target first, then
reads its process's CPU seconds (with its children's) over ``--requests`` requests at the same
concurrency from this driver. The table gives each target's median over the rounds and its ratio
to ``vllm:round_robin``'s in the same run.

    python -m bench.bench_proxy --peers all [--rounds 3] [--requests 4000] [--streams 600]
        [--peer-bin-dir /path/to/venv/bin] [--kvgate-from NAME=DIR ...]

``--kvgate-from compiled=../kvgate-compiled`` adds a gateway run from another checkout (a compiled
build, another commit) to the same rotation, with the same configuration: a change's cost measured
alternately with the code before it and the routers, on the same backends.

The pace rides in the prompt, not in a header: sglang-router forwards neither unknown headers nor
unknown body fields, and its streams would otherwise come back to back.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
import psutil

from bench import peers
from bench.bench_proxy import CHUNKS, MODEL, PACE_PROMPT_PREFIX, _gateway_config, _spawn, _stop, drive
from kvgate.loadtest.client import wait_until_ok
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
                    url = target.url + "/v1/chat/completions"
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
        if not sep or not name or not (path / "bench" / "bench_proxy.py").is_file():
            raise ValueError(f"--kvgate-from {spec!r}: want NAME=DIR, DIR a kvgate checkout")
        if name in {existing for existing, _ in gateways} | {peer.name for peer in peers.PEERS}:
            raise ValueError(f"--kvgate-from {spec!r}: {name} already names a target")
        gateways.append((name, path.resolve()))
    return gateways


async def compare(args: argparse.Namespace) -> int:
    """The comparison ``python -m bench.bench_proxy --peers NAMES`` runs."""
    chosen = peers.select(args.peers)
    try:
        gateways = kvgate_checkouts(args.kvgate_from)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    first_port = free_ports(5 + len(gateways) + 2 * len(chosen))
    backend_ports = list(range(first_port, first_port + 4))
    peer_port = first_port + 4 + len(gateways)
    processes: list[subprocess.Popen[str]] = []
    peer_processes: list[subprocess.Popen[bytes]] = []
    try:
        processes.append(_spawn(["--backend", ",".join(map(str, backend_ports))]))
        targets: list[Target] = []
        for offset, (name, checkout) in enumerate(gateways):
            gateway_port = first_port + 4 + offset
            gateway = _spawn(["--gateway", _gateway_config(backend_ports, gateway_port)], cwd=checkout)
            processes.append(gateway)
            targets.append(Target(name, f"http://127.0.0.1:{gateway_port}", psutil.Process(gateway.pid)))
        urls = [f"http://127.0.0.1:{port}" for port in backend_ports]
        async with aiohttp.ClientSession() as session:
            for target in targets:
                await wait_until_ok(session, target.url + "/readyz")
            for index, peer in enumerate(chosen):
                binary = peers.locate(peer.program, args.peer_bin_dir)
                if binary is None:
                    print(
                        f"{peer.name}: {peer.program} not found (pip install 'kvgate[bench]')",
                        file=sys.stderr,
                    )
                    return 2
                port = peer_port + 2 * index
                proc = subprocess.Popen(
                    peer.command(binary, urls, port, port + 1),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                peer_processes.append(proc)
                url = f"http://127.0.0.1:{port}"
                why = await peers.ready(session, proc, url)
                if why is not None:
                    print(f"{peer.name}: {why}", file=sys.stderr)
                    return 2
                targets.append(Target(peer.name, url, psutil.Process(proc.pid)))
        print(f"targets: {', '.join(t.name for t in targets)}; {args.rounds} rounds each", flush=True)
        await measure(targets, args.rounds, args.requests, args.streams, args.concurrency)
        print_table(targets, args.concurrency)
        return 0
    finally:
        for peer_process in peer_processes:
            peer_process.terminate()
            peer_process.wait(timeout=30)
        for process in reversed(processes):
            _stop(process)
