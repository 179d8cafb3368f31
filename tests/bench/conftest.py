"""What the benchmarks' smoke tests share: a ``redis-server`` to start, for the benchmarks that run
their own (skipped without one, unless ``KVGATE_REQUIRE_REDIS=1`` makes it mandatory)."""

from __future__ import annotations

import os
import shutil

import pytest


@pytest.fixture
def redis_server() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("KVGATE_REQUIRE_REDIS") == "1":
            pytest.fail("no redis-server to start (KVGATE_REQUIRE_REDIS=1)")
        pytest.skip("no redis-server to start")
    return binary
