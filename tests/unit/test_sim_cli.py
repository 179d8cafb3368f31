"""``kvgate sim`` argument handling: the subcommand registers, and bad numbers or profiles exit 2
with one line before serving."""

from __future__ import annotations

import argparse

import pytest

from kvgate.cli import main
from kvgate.cli.sim import register, run


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvgate")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_sim_subcommand_registers_with_its_options() -> None:
    args = _parse(["sim", "--replicas", "3", "--port", "9100", "--time-scale", "2", "--max-num-seqs", "16"])
    assert args.run is run
    assert (args.replicas, args.port, args.time_scale, args.max_num_seqs) == (3, 9100, 2.0, 16)
    assert args.profile == "llama-3.1-8b-h100" and args.cold_start_s is None and args.control_port is None


@pytest.mark.parametrize(
    "argv",
    [
        ["sim", "--kv-capacity-tokens", "-5"],
        ["sim", "--max-num-seqs", "0"],
        ["sim", "--time-scale", "-1"],
        ["sim", "--warmup-s", "-1"],
        ["sim", "--kv-link-bytes-per-s", "0"],
        ["sim", "--kv-transfer-timeout-s", "-1"],
        ["sim", "--profile", "nope"],
        ["sim", "--profile", "/no/such/profile.yaml"],
    ],
)
def test_bad_numbers_exit_2_with_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("kvgate sim: error: ")


def test_role_defaults_to_mixed_and_takes_only_the_three_roles() -> None:
    assert _parse(["sim"]).role == "mixed"
    assert _parse(["sim", "--role", "prefill"]).role == "prefill"
    with pytest.raises(SystemExit):
        _parse(["sim", "--role", "both"])


@pytest.mark.parametrize(
    "argv",
    [
        ["sim", "--kv-events-replay-port", "9300"],
        ["sim", "--kv-events-port", "0"],
        ["sim", "--kv-events-port", "9200", "--kv-events-replay-port", "-1"],
        ["sim", "--cpu-offload-tokens", "-1"],
        ["sim", "--cpu-offload-bytes-per-s", "0"],
    ],
)
def test_bad_kv_events_and_offloading_options_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("kvgate sim: error: ")


def test_kv_events_and_offloading_options_parse() -> None:
    args = _parse(["sim", "--kv-events-port", "9200", "--cpu-offload-tokens", "100000"])
    assert (args.kv_events_port, args.kv_events_topic, args.kv_events_replay_port) == (
        9200,
        "kv-events",
        None,
    )
    assert (args.cpu_offload_tokens, args.cpu_offload_bytes_per_s) == (100_000, None)
