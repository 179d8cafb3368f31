"""Waiting for a child to serve: an HTTP URL that answers 200, or a line it prints once it listens.

A child that exits during start-up fails the wait at once, with its exit status, rather than after
the whole timeout; a benchmark that can go on without it (an optional peer) reads ``NotReady.why``.
"""

from __future__ import annotations

import asyncio
import subprocess
import time

import aiohttp


class NotReady(RuntimeError):
    def __init__(self, what: str, why: str) -> None:
        super().__init__(f"{what}: {why}")
        self.why = why


async def wait_ready(
    session: aiohttp.ClientSession,
    url: str,
    process: subprocess.Popen[bytes] | None = None,
    timeout_s: float = 60.0,
) -> None:
    """Poll ``GET url`` until it answers 200; ``NotReady`` when ``process`` exits first or time runs
    out. Connection errors count as "not yet": a process just started refuses connections."""
    deadline_s = time.monotonic() + timeout_s
    while True:
        if process is not None and process.poll() is not None:
            raise NotReady(url, f"exited with {process.returncode}")
        try:
            async with session.get(url) as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        if time.monotonic() > deadline_s:
            raise NotReady(url, f"no 200 within {timeout_s:g} s")
        await asyncio.sleep(0.05)


def wait_line(process: subprocess.Popen[bytes], prefix: bytes = b"") -> bytes:
    """The first line ``process`` prints (on a pipe) that starts with ``prefix``; ``NotReady`` when
    its output ends first."""
    assert process.stdout is not None, "the child's stdout is not a pipe"
    for line in process.stdout:
        if line.startswith(prefix):
            return line
    raise NotReady(str(process.args), f"exited with {process.wait()} before it printed {prefix!r}")
