"""Free loopback ports for the processes and servers the load tester and the tests start.

A port is picked below the kernel's ephemeral range (32768 and up on Linux), where no other
process's port-0 socket can land on it between this check and the bind: that race once took
``kvgate sim``'s port+1 while the suite ran on two workers. Blocks are consecutive because
``kvgate sim --port P --replicas N`` binds P..P+N-1.
"""

from __future__ import annotations

import random
import socket

LOWEST_PORT = 20000
EPHEMERAL_PORT = 32000
"""Just below Linux's default ``ip_local_port_range`` (32768-60999)."""


def free_ports(count: int = 1, host: str = "127.0.0.1") -> int:
    """The first of ``count`` consecutive ports that ``host`` can bind just now."""
    rng = random.Random()
    for _ in range(200):
        first = rng.randrange(LOWEST_PORT, EPHEMERAL_PORT - count)
        if all(_bindable(host, first + i) for i in range(count)):
            return first
    raise RuntimeError(f"no {count} consecutive free ports found on {host}")


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True
