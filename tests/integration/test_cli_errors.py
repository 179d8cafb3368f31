"""Every ``kvgate`` subcommand, run as the operator runs it (the installed script, a real process),
answers bad input with one line on stderr, ``kvgate <command>: error: ...``, and a non-zero exit:
never a traceback, never a silent success."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvgate.config.loader import EXAMPLES_DIR
from tests.integration.processes import KVGATE


def kvgate(*argv: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KVGATE, *argv], capture_output=True, text=True, timeout=timeout_s, check=False)


def one_error_line(result: subprocess.CompletedProcess[str], command: str) -> str:
    """The single line of a failed run's stderr, checked for its prefix and a non-zero status."""
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"kvgate {command}: error: "), lines[0]
    return lines[0]


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port something else already listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


GOOD_CONFIG = (
    "models: [{name: m, max_model_len: 4096, kv_bytes_per_token: 1024}]\n"
    "pools: [{name: p, replicas: ['http://127.0.0.1:9'], kv_capacity_tokens: 10000}]\n"
)


def test_version_prints_the_package_version() -> None:
    result = kvgate("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == "kvgate 0.1.0"


def test_config_check_names_the_file_and_line_of_a_yaml_syntax_error(tmp_path: Path) -> None:
    path = write(tmp_path, "broken.yaml", "server:\n  port: 80\n bad: [\n")
    line = one_error_line(kvgate("config", "check", path), "config check")
    assert path in line and "not valid YAML at line 3, column 2" in line


def test_config_check_refuses_a_replica_url_without_a_scheme(tmp_path: Path) -> None:
    path = write(tmp_path, "noscheme.yaml", GOOD_CONFIG.replace("http://127.0.0.1:9", "127.0.0.1:9"))
    line = one_error_line(kvgate("config", "check", path), "config check")
    assert "pools.0.replicas" in line and "scheme must be http or https" in line


def test_config_check_still_lists_every_problem_of_a_bad_config(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.yaml", "server: {port: -1}\nmodels: []\npools: []\nhealth: {interval_s: 0}\n")
    result = kvgate("config", "check", path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    first, *problems = result.stderr.strip().splitlines()
    assert first.startswith(f"kvgate config check: error: invalid config {path}: ")
    assert any("server.port" in p for p in problems) and any("health.interval_s" in p for p in problems)


@pytest.mark.parametrize(
    ("argv", "command", "needle"),
    [
        (["config", "check", "/nonexistent/kvgate.yaml"], "config check", "/nonexistent/kvgate.yaml"),
        (["config", "check", "/"], "config check", "cannot read"),
        (["serve", "--config", "/nonexistent/kvgate.yaml"], "serve", "/nonexistent/kvgate.yaml"),
        (["up", "--profile", "bad", "--port", "0"], "up", "unknown profile 'bad'"),
        (["up", "--replicas", "-1", "--port", "0"], "up", "--replicas"),
        (["up", "--time-scale", "-1", "--port", "0"], "up", "--time-scale"),
        (["up", "--min-replicas", "3", "--max-replicas", "2", "--port", "0"], "up", "--max-replicas"),
        (["sim", "--max-num-seqs", "0"], "sim", "max_num_seqs"),
        (["autoscale", "--gateway", "http://127.0.0.1:9", "--iterations", "1"], "autoscale", "127.0.0.1:9"),
        (["autoscale", "--gateway", "nope", "--iterations", "1"], "autoscale", "'nope'"),
        (["autoscale", "--iterations", "1"], "autoscale", "--gateway"),
        (["autoscale", "--gateway", "http://g", "--config", "/nonexistent.yaml"], "autoscale", "nonexistent"),
        (["loadtest", "--target", "http://127.0.0.1:9", "--requests", "1"], "loadtest", "127.0.0.1:9"),
        (["loadtest", "--target", "nope", "--requests", "1"], "loadtest", "'nope'"),
        (
            ["loadtest", "--rate", "2", "--concurrency", "4", "--target", "http://x"],
            "loadtest",
            "--concurrency",
        ),
        (
            ["loadtest", "--workload", "/nonexistent.yaml", "--target", "http://x"],
            "loadtest",
            "/nonexistent.yaml: No such file",
        ),
        (["loadtest", "compare", "--target", "a", "--requests", "1"], "loadtest compare", "NAME=URL"),
        (["serve"], "serve", "--config"),
        (["nope"], "", "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_a_non_zero_exit(
    argv: list[str], command: str, needle: str, tmp_path: Path
) -> None:
    result = kvgate(*argv, "--out", str(tmp_path)) if argv[0] == "loadtest" else kvgate(*argv)
    line = one_error_line(result, command) if command else _top_level(result)
    assert needle in line


def _top_level(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("kvgate: error: ")
    return line


def test_a_yaml_error_in_the_autoscaler_policy_is_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, "policy.yaml", "policy: [\n")
    line = one_error_line(kvgate("autoscale", "--gateway", "http://g", "--config", path), "autoscale")
    assert path in line


def test_serve_and_up_name_the_port_already_in_use(tmp_path: Path, busy_port: int) -> None:
    config = write(tmp_path, "kvgate.yaml", GOOD_CONFIG)
    line = one_error_line(kvgate("serve", "--config", config, "--port", str(busy_port)), "serve")
    assert f"127.0.0.1:{busy_port}" in line
    line = one_error_line(kvgate("up", "--port", str(busy_port), "--time-scale", "0"), "up")
    assert f"127.0.0.1:{busy_port}" in line


def test_the_examples_still_check_ok() -> None:
    result = kvgate("config", "check", str(EXAMPLES_DIR / "static.yaml"))
    assert result.returncode == 0 and result.stderr == ""
