"""The request path's modules compiled to C extensions with mypyc, when ``KVGATE_COMPILE=1`` asks.

Everything else about the package is in pyproject.toml; without the variable this adds nothing and
kvgate stays pure Python, so an install needs no compiler. Compiled, the gateway's CPU per
non-stream request falls by about a fifth (docs/gateway.md, *Compiled with mypyc*). It needs mypy
(the ``dev`` extra), gcc and the Python headers in the building environment:

    make compile          # in place, next to the sources; `make uncompile` removes them
    make test-compiled    # the suite against them
    KVGATE_COMPILE=1 pip wheel --no-build-isolation --no-deps .    # what the Dockerfile builds

Three modules stay interpreted: ``kvgate/gateway/edge/http_protocol.py``, whose protocol class is subclassed
per server (a compiled method refuses that subclass as ``self``); ``kvgate/gateway/edge/errors.py``, whose
error classes set their status and type as class attributes that compiled subclasses do not carry; and
``kvgate/vocabulary/value.py``, since ``dataclass_transform`` cannot mark a compiled function.
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent

COMPILED_PACKAGES = ("kvgate/admission", "kvgate/routing", "kvgate/routing/policies", "kvgate/vocabulary")
"""Every module of these (but ``__init__`` and ``kvgate/vocabulary/value.py``)."""

COMPILED_GATEWAY = (
    "request_path/accounting",
    "telemetry/access_log",
    "telemetry/collectors",
    "request_path/decision_path",
    "request_path/dispatcher",
    "replicas/fleet",
    "request_path/forwarding",
    "request_path/handoff",
    "request_path/leases",
    "telemetry/metrics",
    "telemetry/pool_work",
    "request_path/pricing",
    "request_path/prompt",
    "request_path/proxy",
    "request_path/relay",
    "replicas/replica_connection",
    "replicas/replica_http",
    "edge/request_edge",
    "telemetry/sliding_windows",
    "state",
    "replicas/upstream",
    "telemetry/fleet_work",
)
"""The gateway's modules on a completion request's path, from parser to access-log line."""

INTERPRETED = {"kvgate/vocabulary/value.py"}


def compiled_sources() -> list[str]:
    sources = [f"kvgate/gateway/{name}.py" for name in COMPILED_GATEWAY]
    for package in COMPILED_PACKAGES:
        for path in sorted((ROOT / package).glob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if path.name != "__init__.py" and relative not in INTERPRETED:
                sources.append(relative)
    return sources


def extensions() -> list[object]:
    if os.environ.get("KVGATE_COMPILE") != "1":
        return []
    from mypyc.build import mypycify

    return list(mypycify(compiled_sources(), opt_level="3", group_name="kvgate._compiled"))


setup(ext_modules=extensions())
