"""The Rust routers a user would otherwise put in front of vLLM, as optional targets of a bench.

``vllm-router`` and ``sglang-router`` come from PyPI (``pip install 'kvgate[bench]'``, never a
runtime dependency) as console scripts around a Rust server. Each is started the way its README
starts it: ``--worker-urls`` of the replicas and a ``--policy``, nothing tuned. Both also open a
Prometheus listener on port 29000 unless told otherwise, and the second one to try panics on the
taken port, so every instance gets its own ``--prometheus-port``. Both answer ``GET /health`` once
they serve.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp


@dataclass(frozen=True, slots=True)
class Peer:
    name: str
    """How the bench's tables call it: program and policy."""
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


async def ready(
    session: aiohttp.ClientSession, proc: subprocess.Popen[bytes], url: str, timeout_s: float = 30.0
) -> str | None:
    """None once ``url/health`` answers 200; otherwise why not: the process exited, or time ran out."""
    deadline_s = time.monotonic() + timeout_s
    while proc.poll() is None:
        try:
            async with session.get(url + "/health") as response:
                if response.status == 200:
                    return None
        except aiohttp.ClientError:
            pass
        if time.monotonic() > deadline_s:
            return f"no 200 from /health within {timeout_s:g} s"
        await asyncio.sleep(0.1)
    return f"exited with {proc.returncode}"
