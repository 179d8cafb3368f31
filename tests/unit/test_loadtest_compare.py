import argparse
from dataclasses import replace

import pytest

from kvgate.cli.command import CommandError
from kvgate.cli.loadtest import register
from kvgate.loadtest.compare import order, ratios, slices
from kvgate.loadtest.report import Summary
from kvgate.loadtest.runner import Target
from kvgate.loadtest.workload import build_trace
from kvgate.loadtest.workload_file import load_workload, with_overrides


def test_slices_partition_the_trace_and_shift_to_zero() -> None:
    trace = build_trace(with_overrides(load_workload("chat"), duration_s=20.0, rate_rps=5.0), 1)
    parts = slices(trace, 4)
    assert [start for start, _ in parts] == [0.0, 5.0, 10.0, 15.0]
    indices = [r.index for _, part in parts for r in part.requests]
    assert indices == [r.index for r in trace.requests]
    for start_s, part in parts:
        assert part.duration_s == 5.0
        for request in part.requests:
            assert request.at_s is not None
            assert 0.0 <= request.at_s < 5.0
            assert request.at_s + start_s == pytest.approx(trace.requests[request.index].at_s)


def test_closed_loop_slices_split_by_index() -> None:
    trace = build_trace(with_overrides(load_workload("chat"), concurrency=2, max_requests=10), 1)
    parts = slices(trace, 3)
    assert [len(part.requests) for _, part in parts] == [3, 3, 4]


def test_order_rotates_per_slice() -> None:
    a, b, c = Target("a", "u"), Target("b", "u"), Target("c", "u")
    assert [t.name for t in order([a, b], 0)] == ["a", "b"]
    assert [t.name for t in order([a, b], 1)] == ["b", "a"]
    assert [t.name for t in order([a, b, c], 2)] == ["c", "a", "b"]


def _summary(name: str, goodput_rps: float, ttft_p95_s: float | None, rejects: int) -> Summary:
    fields = {f: 0 for f in Summary.__dataclass_fields__}
    base = Summary(**fields)  # type: ignore[arg-type]
    return replace(
        base, target=name, goodput_rps=goodput_rps, ttft_p95_s=ttft_p95_s, rejects=rejects, schedule_kept=True
    )


def test_ratios_against_baseline() -> None:
    table = ratios([_summary("rr", 2.0, 1.0, 10), _summary("kv", 3.0, 0.5, 0)], "rr")
    assert table["rr"] == {"goodput": 1.0, "ttft_p95": 1.0, "rejects": 1.0}
    assert table["kv"] == {"goodput": 1.5, "ttft_p95": 0.5, "rejects": 0.0}
    zero = ratios([_summary("a", 1.0, None, 0), _summary("b", 1.0, 0.2, 3)], "a")
    assert zero["b"] == {"goodput": 1.0, "ttft_p95": None, "rejects": None}
    with pytest.raises(ValueError, match="baseline"):
        ratios([_summary("a", 1.0, 1.0, 0)], "zz")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvgate")
    register(parser.add_subparsers(dest="command"))
    return parser


def test_cli_run_flags() -> None:
    args = _parser().parse_args(
        [
            "loadtest",
            "--target",
            "http://h:8080",
            "--workload",
            "mixed",
            "--duration",
            "5",
            "--rate",
            "3",
            "--seed",
            "4",
            "--slo-ttft-s",
            "1.5",
            "--slo-itl-s",
            "0.2",
            "--retry",
            "--out",
            "/tmp/x",
        ]
    )
    assert args.run.__name__ == "main_run"
    assert (args.target, args.workload, args.duration_s, args.rate_rps, args.seed) == (
        "http://h:8080",
        "mixed",
        5.0,
        3.0,
        4,
    )
    assert (args.slo_ttft_s, args.slo_itl_s, args.retry) == (1.5, 0.2, True)


def test_cli_compare_flags() -> None:
    args = _parser().parse_args(
        [
            "loadtest",
            "compare",
            "--target",
            "a=http://h:1",
            "--target",
            "b=http://h:2",
            "--baseline",
            "b",
            "--workload",
            "burst",
        ]
    )
    assert args.run.__name__ == "main_compare"
    assert args.targets == ["a=http://h:1", "b=http://h:2"]
    assert args.baseline == "b"
    assert args.workload == "burst"


def test_cli_run_without_target_fails() -> None:
    args = _parser().parse_args(["loadtest"])
    with pytest.raises(CommandError, match="--target URL is required") as failure:
        args.run(args)
    assert failure.value.status == 1
