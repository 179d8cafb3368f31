"""Simulated vLLM fleets for a benchmark to measure against, each in a process of its own.

Two ways, for two needs. ``kvgate sim`` (``start_sim``) is the fleet as operators start it: one role,
consecutive ports, and its control API on the port after them (after ``spare_ports`` more, kept free
for replicas the control API adds later); scenarios that kill or add replicas use it. A fleet child
(``start_fleet_child``: ``bench.harness.fleet_child``) is a ``SimFleet`` in a child process with any
profile override (the replicas' warm-up turned off, a smaller KV cache) and several roles in one
fleet (a prefill/decode pair); it prints its replicas' URLs by role once they serve.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from bench.harness.gateway import kvgate_command
from bench.harness.processes import Children, Output
from bench.harness.ready import wait_line, wait_ready
from kvgate.sim.ports import free_ports


@dataclass(frozen=True, slots=True)
class SimSpec:
    """What ``kvgate sim`` is told; None leaves the profile's (or the command's) default."""

    replicas: int
    profile: str | None = None
    model: str | None = None
    kv_capacity_tokens: int | None = None
    max_num_seqs: int | None = None
    time_scale: float | None = None
    seed: int | None = None
    cold_start_s: float = 0.0
    spare_ports: int = 0
    kv_events_port: int | None = None
    """Replica i publishes its KV cache events on this port + i."""

    def arguments(self, port: int, control_port: int) -> list[str]:
        args = ["sim", "--replicas", str(self.replicas), "--port", str(port)]
        args += ["--control-port", str(control_port), "--cold-start-s", f"{self.cold_start_s:g}"]
        for flag, value in (
            ("--profile", self.profile),
            ("--model", self.model),
            ("--kv-capacity-tokens", self.kv_capacity_tokens),
            ("--max-num-seqs", self.max_num_seqs),
            ("--time-scale", self.time_scale),
            ("--seed", self.seed),
            ("--kv-events-port", self.kv_events_port),
        ):
            if value is not None:
                args += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
        return args


@dataclass(frozen=True, slots=True)
class SimProcess:
    urls: tuple[str, ...]
    control_url: str
    process: subprocess.Popen[bytes]

    async def ready(self, session: aiohttp.ClientSession) -> None:
        for url in self.urls:
            await wait_ready(session, url + "/health", self.process)


def start_sim(
    children: Children,
    spec: SimSpec,
    *,
    output: Output = subprocess.DEVNULL,
    python_args: Sequence[str] = (),
) -> SimProcess:
    """``kvgate sim`` on free ports (``python_args`` go to the interpreter, e.g. a profiler)."""
    port = free_ports(spec.replicas + spec.spare_ports + 1)
    control_port = port + spec.replicas + spec.spare_ports
    command = kvgate_command(*spec.arguments(port, control_port))
    process = children.start([command[0], *python_args, *command[1:]], output=output)
    urls = tuple(f"http://127.0.0.1:{port + i}" for i in range(spec.replicas))
    return SimProcess(urls, f"http://127.0.0.1:{control_port}", process)


async def serve_sim(
    children: Children, session: aiohttp.ClientSession, spec: SimSpec, **options: Any
) -> SimProcess:
    """``start_sim``, then wait until every replica answers ``/health``."""
    sim = start_sim(children, spec, **options)
    await sim.ready(session)
    return sim


def start_fleet_child(
    children: Children,
    roles: Mapping[str, int],
    *,
    time_scale: float = 1.0,
    seed: int = 0,
    overrides: Mapping[str, Any] | None = None,
    kv_events: bool = False,
) -> dict[str, list[str]]:
    """A ``SimFleet`` of ``roles`` (``{"mixed": 4}``, ``{"prefill": 2, "decode": 2}``) in a child;
    its replicas' URLs by role, once they serve. With ``kv_events`` its replicas publish them."""
    spec = ",".join(f"{role}:{count}" for role, count in roles.items())
    command = [sys.executable, "-m", "bench.harness.fleet_child", spec, "--time-scale", str(time_scale)]
    command += ["--seed", str(seed)]
    command += ["--overrides", orjson.dumps(dict(overrides or {})).decode()]
    if kv_events:
        command.append("--kv-events")
    process = children.start(command, output=subprocess.PIPE, stderr=None)
    urls: dict[str, list[str]] = orjson.loads(wait_line(process))
    return urls
