"""Replica base URLs: the one check and normal form every source of replica URLs goes through.

A replica URL is ``http(s)://host[:port]``: no path, query, fragment or credentials, and no
whitespace or control character anywhere (``urllib`` silently drops a tab or newline before
parsing, so checking its parse would accept a URL that is not the one stored). The normal form has
the scheme and host in lower case and no trailing slash; it is what the gateway stores, probes,
routes to and labels metrics with.
"""

from __future__ import annotations

from urllib.parse import urlsplit


def replica_base_url(url: object) -> str:
    """``url`` in normal form; ``ValueError`` saying what is wrong with it otherwise."""
    if not isinstance(url, str):
        raise ValueError("not a string")
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        raise ValueError("whitespace and control characters are not allowed in a replica URL")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise ValueError("scheme must be http or https")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise ValueError("port must be a number from 1 to 65535")
    host = parts.hostname
    if not host:
        raise ValueError("no host")
    if parts.username is not None or parts.password is not None:
        raise ValueError("credentials are not allowed in a replica URL")
    if parts.path not in ("", "/") or parts.query or parts.fragment or url.endswith(("?", "#")):
        raise ValueError(
            "a replica URL is a base URL without path, query or fragment (the gateway adds /v1/...)"
        )
    netloc = f"[{host}]" if ":" in host else host
    return f"{scheme}://{netloc}" + ("" if port is None else f":{port}")
