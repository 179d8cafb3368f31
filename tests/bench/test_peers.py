import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from bench.harness.peers import PEERS, locate, ready, select

URLS = ["http://127.0.0.1:8000", "http://127.0.0.1:8001"]


def test_vllm_router_command_names_workers_policy_and_its_own_metrics_port() -> None:
    peer = select("vllm:cache_aware")[0]
    assert peer.command("/bin/vllm-router", URLS, 9000, 9001) == [
        "/bin/vllm-router",
        "--host",
        "127.0.0.1",
        "--port",
        "9000",
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        "9001",
        "--policy",
        "cache_aware",
        "--log-level",
        "warning",
        "--worker-urls",
        *URLS,
    ]


def test_sglang_router_is_launched_with_its_subcommand_and_log_level() -> None:
    command = select("sglang:cache_aware")[0].command("sglang-router", URLS, 9000, 9001)
    assert command[:2] == ["sglang-router", "launch"]
    assert command[command.index("--log-level") + 1] == "warn"
    assert command[-3:] == ["--worker-urls", *URLS]


def test_select_all_none_and_lists() -> None:
    assert select("all") == list(PEERS)
    assert select("none") == []
    assert [p.name for p in select(" sglang:cache_aware, vllm:round_robin ")] == [
        "sglang:cache_aware",
        "vllm:round_robin",
    ]
    with pytest.raises(ValueError, match="unknown peer 'nginx'"):
        select("nginx")


def test_locate_looks_in_the_given_directory_first(tmp_path: Path) -> None:
    script = tmp_path / "kvgate-test-router"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    assert locate("kvgate-test-router", tmp_path) == str(script)
    assert locate("kvgate-test-router") is None


async def test_ready_says_when_the_router_exits_before_serving() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    async with aiohttp.ClientSession() as session:
        assert await ready(session, proc, "http://127.0.0.1:9", timeout_s=10) == "exited with 3"
