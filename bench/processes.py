"""Child processes a benchmark starts (fleets, gateways, routers), stopped however the run ends."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator


@contextlib.contextmanager
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """A list to append started processes to; on exit each gets SIGTERM, then SIGKILL after 10 s."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for proc in started:
            proc.terminate()
        for proc in started:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
