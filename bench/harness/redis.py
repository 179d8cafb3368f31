"""A private ``redis-server`` for the benchmarks that share state between gateways: on loopback, on a
port of its own, persisting nothing (no snapshot, no append-only file), so a restart starts empty."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from bench.harness.processes import Children, Output


def start_redis(
    children: Children, port: int, output: Output = subprocess.DEVNULL, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """``RuntimeError`` when no ``redis-server`` is on the path."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server not found")
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    return children.start(argv, output=output, cwd=cwd)
