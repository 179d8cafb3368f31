"""The edge's limits, read once per server: timeouts, header sizes and the client connection cap.

The cap is lowered at start to fit the descriptor limit, whose soft value is raised to the hard:
each client connection needs at most one upstream connection at a time, and a few descriptors are
kept for everything else.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

from kvgate.config.server import Server

logger = logging.getLogger("kvgate.edge")

RESERVED_DESCRIPTORS = 128
"""Descriptors kept out of the connection cap: listeners, Redis, DNS, health probes, files."""


@dataclass(frozen=True, slots=True)
class EdgeLimits:
    header_timeout_s: float
    body_timeout_s: float
    body_min_rate_bytes_per_s: float
    send_timeout_s: float
    send_buffer_bytes: int
    max_connections: int
    max_header_bytes: int
    max_headers: int


def edge_limits(server: Server) -> EdgeLimits:
    """``server``'s limits, the connection cap fitted under the (raised) descriptor limit."""
    descriptors = raise_descriptor_limit()
    cap = connection_cap(server.max_connections, server.upstream_connections, descriptors)
    if cap < server.max_connections:
        logger.warning(
            "client connections capped at %d (server.max_connections %d) to fit %d descriptors",
            cap,
            server.max_connections,
            descriptors,
        )
    return EdgeLimits(
        header_timeout_s=server.header_timeout_s,
        body_timeout_s=server.body_timeout_s,
        body_min_rate_bytes_per_s=server.body_min_rate_bytes_per_s,
        send_timeout_s=server.send_timeout_s,
        send_buffer_bytes=server.client_send_buffer_bytes,
        max_connections=cap,
        max_header_bytes=server.max_header_bytes,
        max_headers=server.max_headers,
    )


def raise_descriptor_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            logger.warning("cannot raise the descriptor limit from %d to %d: %s", soft, hard, exc)
    return soft if soft != resource.RLIM_INFINITY else 1 << 30


def connection_cap(max_connections: int, upstream_connections: int, descriptors: int) -> int:
    """Most client connections that fit in ``descriptors`` beside the upstream pool.

    Each client connection needs at most one upstream connection at a time, so client connections
    get at least half of what the reserve leaves, and all of it but the upstream pool's when that
    is smaller."""
    spare = max(descriptors - RESERVED_DESCRIPTORS, 2)
    return max(1, min(max_connections, max(spare // 2, spare - upstream_connections)))
