"""Fixtures shared by every test layer: a real Redis server, found or started."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

from kvgate.sim.ports import free_ports


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def redis_server_binary(why: str) -> str:
    """The ``redis-server`` to start; without one the test skips, or fails under
    ``KVGATE_REQUIRE_REDIS=1`` (CI), so a missing binary never hides Redis tests there."""
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("KVGATE_REQUIRE_REDIS") == "1":
            pytest.fail(f"{why} and no redis-server to start (KVGATE_REQUIRE_REDIS=1)")
        pytest.skip(f"{why} and no redis-server to start")
    return binary


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """``REDIS_URL`` if set, else the local server on 6379 if it answers, else a private
    ``redis-server`` on a free port. With ``KVGATE_REQUIRE_REDIS=1`` a missing Redis fails."""
    if url := os.environ.get("REDIS_URL"):
        yield url
        return
    if _answers("127.0.0.1", 6379):
        yield "redis://127.0.0.1:6379/0"
        return
    binary = redis_server_binary("no Redis reachable")
    port = free_ports()
    with tempfile.TemporaryDirectory() as workdir:
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            cwd=workdir,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 10
            while not _answers("127.0.0.1", port):
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail(f"redis-server did not start on port {port}")
                time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait(timeout=10)
