"""``kvgate serve`` as its own process, as operators run it, from a config document.

The config is written as YAML next to the run's other output (what a run measured can be started
again by hand) and the gateway is ``python -m kvgate serve``: started from another checkout's
directory (``cwd``), ``-m`` puts that checkout first on the path, so a before/after comparison runs
each side's own code. ``wrapper`` goes in front of the command (a profiler such as py-spy).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bench.harness.processes import Children, Output
from bench.harness.ready import wait_ready


def kvgate_command(*args: str) -> list[str]:
    """``kvgate ARGS`` run by this interpreter."""
    return [sys.executable, "-m", "kvgate", *args]


@dataclass(frozen=True, slots=True)
class Gateway:
    url: str
    process: subprocess.Popen[bytes]

    async def ready(self, session: aiohttp.ClientSession, timeout_s: float = 60.0) -> None:
        await wait_ready(session, self.url + "/readyz", self.process, timeout_s)


def start_gateway(
    children: Children,
    config: Mapping[str, Any],
    config_path: Path,
    *,
    log_level: str = "warning",
    output: Output = subprocess.DEVNULL,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    wrapper: Sequence[str] = (),
    nofile: int | None = None,
) -> Gateway:
    """Write ``config`` to ``config_path`` and start the gateway on it; ``Gateway.ready`` waits."""
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(yaml.safe_dump(dict(config)))
    command = kvgate_command("serve", "--config", str(config_path.resolve()), "--log-level", log_level)
    process = children.start([*wrapper, *command], output=output, cwd=cwd, env=env, nofile=nofile)
    server = config["server"]
    return Gateway(f"http://{server['host']}:{server['port']}", process)


async def serve_gateway(
    children: Children,
    session: aiohttp.ClientSession,
    config: Mapping[str, Any],
    config_path: Path,
    **options: Any,
) -> Gateway:
    """``start_gateway``, then wait until it is ready."""
    gateway = start_gateway(children, config, config_path, **options)
    await gateway.ready(session)
    return gateway
