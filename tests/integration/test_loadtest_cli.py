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


def test_a_mooncake_trace_replays_with_its_lengths_and_states_its_reuse_ceiling(
    sim_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        {"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [1, 2]},
        {"timestamp": 200, "input_length": 1100, "output_length": 3, "hash_ids": [1, 2, 3]},
        {"timestamp": 400, "input_length": 300, "output_length": 4, "hash_ids": [9]},
        {"timestamp": 9000, "input_length": 600, "output_length": 2, "hash_ids": [1, 4]},
    ]
    trace = tmp_path / "replay.jsonl"
    trace.write_bytes(b"\n".join(orjson.dumps(row) for row in rows))
    parser = argparse.ArgumentParser(prog="kvgate")
    register(parser.add_subparsers(dest="command"))
    out = tmp_path / "report"
    argv = ["loadtest", "--target", sim_url, "--trace", str(trace), "--window-s", "5", "--speed", "4"]
    argv += ["--cache-tokens", "100000", "--slo-ttft-prompt-tokens-per-s", "16000", "--out", str(out)]
    args = parser.parse_args(argv)
    assert args.run(args) == 0
    stdout = capsys.readouterr().out
    # the second finds the first's block 1 (block 2 is 188 tokens there, 512 here): 512 of 2,100 tokens
    assert "reuse ceiling: 0.244" in stdout
    saved = orjson.loads((out / "results.json").read_bytes())
    summary = saved["summaries"][0]
    assert summary["requests"] == 3, "the request 9 s in is outside the 5 s window"
    assert summary["prompt_tokens"] == 700 + 1100 + 300
    assert summary["completion_tokens"] == 5 + 3 + 4
    report = (out / "report.md").read_text()
    assert "reuse ceiling" in report and "1 s + prompt / 16,000 tokens/s" in report
