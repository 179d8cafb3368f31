"""``kvgate loadtest`` from the command line against a simulator in its own process."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from kvgate.cli.loadtest import register
from kvgate.sim.ports import free_ports


@pytest.fixture
def sim_url() -> Iterator[str]:
    port = free_ports()
    process = subprocess.Popen(
        [sys.executable, "-m", "kvgate", "sim", "--port", str(port), "--control-port", str(free_ports()),
         "--time-scale", "0.02", "--cold-start-s", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_loadtest_command_writes_the_report(
    sim_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = tmp_path / "tiny.yaml"
    workload.write_text(
        "duration_s: 1\nrate_rps: 10\n"
        "classes:\n  - prompt_tokens: {uniform: [20, 60]}\n    output_tokens: 8\n"
    )
    parser = argparse.ArgumentParser(prog="kvgate")
    register(parser.add_subparsers(dest="command"))
    out = tmp_path / "report"
    args = parser.parse_args(
        ["loadtest", "--target", sim_url, "--workload", str(workload), "--seed", "3", "--out", str(out)]
    )
    assert args.run(args) == 0
    captured = capsys.readouterr()
    assert "generator CPU" in captured.out
    assert "sent" in captured.err
    saved = orjson.loads((out / "results.json").read_bytes())
    summary = saved["summaries"][0]
    assert summary["requests"] == saved["workload"]["requests"] > 0
    assert summary["ok"] == summary["requests"]
    assert summary["completion_tokens"] == 8 * summary["requests"]
    assert summary["cpu_per_request_ms"] > 0
    assert {p.name for p in out.iterdir()} >= {"report.md", "results.json", "ttft_cdf.png", "rates.png"}

    args.fail_below_goodput = 1.01
    assert args.run(args) == 2
