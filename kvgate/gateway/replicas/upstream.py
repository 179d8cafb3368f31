"""The one shared aiohttp session of every upstream call but the completion routes' own.

Health probes, ``/metrics`` scrapes and ``/tokenize`` go through it; the two
completion routes use ``kvgate.gateway.replicas.replica_http.ReplicaClient``, which costs a fifth of its CPU
per request. Connections are kept alive per replica. Bodies are taken untouched: no automatic decompression
and no ``Accept-Encoding``/``User-Agent`` added. No cookie jar: one client's cookies must never reach another
client's request. aiohttp sets ``TCP_NODELAY`` on every connection it opens
(``aiohttp.base_protocol.BaseProtocol.connection_made``). Every call carries the replica's pool ``api_key``
(``replica_headers``).
"""

from __future__ import annotations

import aiohttp

from kvgate.config.server import Server
from kvgate.gateway.state import ReplicaState


def replica_headers(replica: ReplicaState) -> dict[str, str] | None:
    """Headers of the gateway's own calls to ``replica``: its pool's ``Authorization``, if any."""
    if replica.authorization is None:
        return None
    return {"Authorization": replica.authorization.decode("latin-1")}


def create_session(server: Server) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(
        limit=server.upstream_connections,
        limit_per_host=0,
        keepalive_timeout=server.keepalive_s,
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=server.timeouts.connect_s),
        auto_decompress=False,
        skip_auto_headers=("Accept-Encoding", "User-Agent"),
        raise_for_status=False,
        cookie_jar=aiohttp.DummyCookieJar(),
    )
