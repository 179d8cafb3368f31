"""``python -m bench.bench_streams``, cut to one small point: backends, gateway and drivers as
their own processes, every stream relayed to its end, the gateway's work back to zero, the report
and its plot written."""

from pathlib import Path

import orjson
import pytest

from bench.bench_streams import main, result_of, work_gauges


def test_a_small_point_relays_every_stream_and_leaves_no_work(tmp_path: Path) -> None:
    report, results = tmp_path / "streams.md", tmp_path / "streams.json"
    sizes = ["--points", "40@200", "--window-s", "2", "--drivers", "1", "--open-per-s", "200"]
    assert main([*sizes, "--report", str(report), "--results", str(results)]) == 0
    result = result_of(orjson.loads(results.read_bytes())["results"][0])
    for side in (result.via, result.direct):
        assert (side.streams_done, side.errors) == (40, 0), side.first_error
        assert side.window_tokens > 0
    assert set(result.gateway.work_after.values()) == {0.0}
    assert result.gateway.open_rss_bytes > 0 and result.gateway.cpu_s > 0
    assert "| 40 | 200 |" in report.read_text()
    assert (tmp_path / "streams.png").stat().st_size > 0


def test_a_missing_work_gauge_is_an_error_not_a_zero() -> None:
    metrics = 'kvgate_resident_sequences{pool="p"} 3.0\nkvgate_queued_requests 0.0\n'
    with pytest.raises(RuntimeError, match="kvgate_pending_prompt_tokens"):
        work_gauges(metrics)
