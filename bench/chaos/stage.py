"""The processes of one chaos scenario, each logging to a file of its own, and what is read off them.

``Stage`` starts ``kvgate sim``, ``kvgate serve`` and a private ``redis-server`` on free loopback
ports through the harness, and stops them all. A gateway config is validated before use; keys
today's gateway does not know (settings other work is adding) are dropped, named, and the run goes
on. A gateway's log is searched for tracebacks; its RSS and descriptors are read with psutil.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from bench.harness.fleet import SimSpec, serve_sim
from bench.harness.gateway import serve_gateway
from bench.harness.processes import Children
from bench.harness.redis import start_redis
from kvgate.config.loader import ConfigError, parse_config
from kvgate.sim.ports import free_ports


def validate_config(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``data`` as today's gateway accepts it, and the keys it had to drop (unknown today)."""
    dropped: list[str] = []
    while True:
        try:
            parse_config(data, {})
            return data, dropped
        except ConfigError as exc:
            unknown = [p.key for p in exc.problems if p.message == "unknown key"]
            if not unknown or len(unknown) != len(exc.problems):
                raise
            for key in unknown:
                section, _, name = key.rpartition(".")
                target: Any = data
                for part in section.split(".") if section else []:
                    target = target[int(part)] if isinstance(target, list) else target[part]
                del target[name]
                dropped.append(key)


class Stage:
    """Every process a scenario started, with their logs in ``log_dir``; ``stop_all`` ends them."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children = Children()
        self.unknown_keys: list[str] = []

    async def sim(self, session: aiohttp.ClientSession, name: str, replicas: int) -> tuple[list[str], str]:
        """The replicas' URLs and the simulator's control API."""
        sim = await serve_sim(
            self.children, session, SimSpec(replicas), output=self.log_dir / f"{name}-sim.log"
        )
        return list(sim.urls), sim.control_url

    async def gateway(
        self, session: aiohttp.ClientSession, name: str, data: dict[str, Any], nofile: int | None = None
    ) -> tuple[str, subprocess.Popen[bytes]]:
        data = {**data, "server": {**data.get("server", {}), "host": "127.0.0.1", "port": free_ports()}}
        data, dropped = validate_config(data)
        self.unknown_keys += [k for k in dropped if k not in self.unknown_keys]
        gateway = await serve_gateway(
            self.children,
            session,
            data,
            self.log_dir / f"{name}.yaml",
            log_level="info",
            output=self.log_dir / f"{name}.log",
            nofile=nofile,
        )
        return gateway.url, gateway.process

    def redis(self, name: str, port: int) -> subprocess.Popen[bytes]:
        return start_redis(self.children, port, output=self.log_dir / f"{name}-redis.log")

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        self.children.stop(proc)

    def stop_all(self) -> None:
        self.children.stop_all()


def tracebacks(log: Path) -> list[str]:
    """The last line of each traceback in a log (the exception), in order."""
    lines = log.read_text(errors="replace").splitlines()
    found = []
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last)"):
            j = i + 1
            while j < len(lines) and (lines[j].startswith(" ") or not lines[j].strip()):
                j += 1
            found.append(lines[j][:160] if j < len(lines) else "?")
    return found


def footprint(proc: subprocess.Popen[bytes]) -> tuple[float, int]:
    """The process's resident memory (MiB) and open descriptors."""
    p = psutil.Process(proc.pid)
    return p.memory_info().rss / 2**20, p.num_fds()
