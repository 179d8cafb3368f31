"""The Rust routers a user would otherwise put in front of vLLM, as optional targets of a benchmark.

``vllm-router`` and ``sglang-router`` come from PyPI (``pip install 'kvgate[bench]'``, never a
runtime dependency) as console scripts around a Rust server. Each is started the way its README
starts it: ``--worker-urls`` of the replicas and a ``--policy``, nothing tuned. Both also open a
Prometheus listener on port 29000 unless told otherwise, and the second one to try panics on the
taken port, so every instance gets its own ``--prometheus-port``. Both answer ``GET /health`` once
they serve. A benchmark whose routers are not installed still runs its kvgate rows.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.harness.processes import Children, Output
from bench.harness.ready import NotReady, wait_ready
from kvgate.sim.ports import free_ports


@dataclass(frozen=True, slots=True)
class Peer:
    name: str
    """How the benchmarks' tables call it: program and policy."""
    program: str
    """The console script the wheel installs."""
    policy: str
    subcommand: tuple[str, ...] = ()
    log_level: str = "warning"

    def command(self, binary: str, urls: Sequence[str], port: int, metrics_port: int) -> list[str]:
        return [
            binary,
            *self.subcommand,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(metrics_port),
            "--policy",
            self.policy,
            "--log-level",
            self.log_level,
            "--worker-urls",
            *urls,
        ]


PEERS = (
    Peer("vllm:round_robin", "vllm-router", "round_robin"),
    Peer("vllm:cache_aware", "vllm-router", "cache_aware"),
    Peer("sglang:cache_aware", "sglang-router", "cache_aware", ("launch",), "warn"),
)


def select(names: str) -> list[Peer]:
    """``all``, ``none`` or a comma-separated list of peer names; ``ValueError`` for an unknown one."""
    if names == "all":
        return list(PEERS)
    if names == "none":
        return []
    by_name = {peer.name: peer for peer in PEERS}
    chosen = []
    for name in (n.strip() for n in names.split(",") if n.strip()):
        if name not in by_name:
            raise ValueError(f"unknown peer {name!r}; known: {', '.join(by_name)}, all, none")
        chosen.append(by_name[name])
    return chosen


def locate(program: str, bin_dir: Path | None = None) -> str | None:
    """``bin_dir`` first (a separate virtual environment holding the routers), then the directory
    of this interpreter's scripts, then ``PATH``."""
    here = os.path.dirname(sys.executable)
    for directory in (*([str(bin_dir)] if bin_dir else []), here):
        found = shutil.which(program, path=directory)
        if found:
            return found
    return shutil.which(program)


def start_peer(
    children: Children,
    peer: Peer,
    binary: str,
    urls: Sequence[str],
    output: Output = subprocess.DEVNULL,
) -> tuple[subprocess.Popen[bytes], str]:
    """The router in front of ``urls`` on free ports: its process and its URL (``ready`` waits)."""
    port = free_ports(2)
    process = children.start(peer.command(binary, urls, port, port + 1), output=output)
    return process, f"http://127.0.0.1:{port}"


async def ready(
    session: aiohttp.ClientSession, proc: subprocess.Popen[bytes], url: str, timeout_s: float = 30.0
) -> str | None:
    """None once ``url/health`` answers 200; otherwise why not: the process exited, or time ran out."""
    try:
        await wait_ready(session, url + "/health", proc, timeout_s)
    except NotReady as exc:
        return exc.why
    return None
