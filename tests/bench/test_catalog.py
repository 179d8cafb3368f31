"""One entry point for every benchmark: ``python -m bench`` lists them one line each, runs one by
name, and every benchmark in ``bench/`` is in the list with a ``main`` to run; a run writes into
``--out`` (default ``bench-out/<name>``) its printed output too, and nothing into ``docs/``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.__main__ import main
from bench.catalog import CATALOG
from bench.harness.cli import OUTPUT_FILE, benchmark_parser, recorded

ROOT = Path(__file__).resolve().parents[2]
SHARED = {"__init__", "__main__", "catalog", "harness"}


def test_the_list_has_one_line_per_benchmark_saying_what_it_measures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([]) == 0
    lines = capsys.readouterr().out.splitlines()[2:]
    assert [line.split()[0] for line in lines] == [benchmark.name for benchmark in CATALOG]
    assert all(len(line.split()) > 4 for line in lines)


def test_every_benchmark_in_bench_is_listed_and_runnable() -> None:
    found = {
        path.stem
        for path in (ROOT / "bench").iterdir()
        if path.suffix == ".py" or (path / "__init__.py").exists()
    }
    assert found - SHARED == {benchmark.name for benchmark in CATALOG}
    for benchmark in CATALOG:
        assert benchmark.module.split(".")[1] == benchmark.name
        assert callable(benchmark.main())


def test_an_unknown_name_is_refused_with_the_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nosuch"]) == 2
    captured = capsys.readouterr()
    assert "unknown benchmark 'nosuch'" in captured.err and "routing_lab" in captured.out


def test_a_benchmark_runs_by_name_in_a_process_of_its_own(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "bench", "decision_cost", "--rounds", "1", "--decisions", "5"]
    done = subprocess.run(
        [*command, "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "| 1 gateway, no Redis |" in done.stdout
    assert (tmp_path / OUTPUT_FILE).read_text() == done.stdout


def test_a_run_writes_under_bench_out_by_default_and_keeps_what_it_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    args = benchmark_parser("example", "an example", seed=7).parse_args([])
    assert (args.out, args.seed) == (Path("bench-out/example"), 7)
    with recorded(args.out) as out:
        print("a table")
    assert capsys.readouterr().out == "a table\n"
    assert (tmp_path / "bench-out" / "example" / OUTPUT_FILE).read_text() == "a table\n"
    assert out == args.out


def test_nothing_in_bench_names_docs_as_a_default_output() -> None:
    offenders = [
        path.relative_to(ROOT)
        for path in (ROOT / "bench").rglob("*.py")
        if 'default="docs' in path.read_text() or 'default=Path("docs' in path.read_text()
    ]
    assert offenders == []
