"""``python -m bench streams``, cut to one small point with short pauses: backends, gateway and
drivers as their own processes, every stream relayed to its end, the gateway's work back to zero,
the figures, the report and its plot written into ``--out``."""

from pathlib import Path

import orjson
import pytest

from bench.streams.__main__ import main
from bench.streams.figures import result_of
from bench.streams.measure import work_gauges


def test_a_small_point_relays_every_stream_and_leaves_no_work(tmp_path: Path) -> None:
    sizes = ["--points", "40@200", "--window-s", "2", "--drivers", "1", "--open-per-s", "200"]
    pauses = ["--settle-s", "0.5", "--tail-s", "0.5", "--idle-s", "0.5"]
    assert main([*sizes, *pauses, "--out", str(tmp_path)]) == 0
    result = result_of(orjson.loads((tmp_path / "results.json").read_bytes())["results"][0])
    for side in (result.via, result.direct):
        assert (side.streams_done, side.errors) == (40, 0), side.first_error
        assert side.window_tokens > 0
    assert set(result.gateway.work_after.values()) == {0.0}
    assert result.gateway.open_rss_bytes > 0 and result.gateway.cpu_s > 0
    assert "| 40 | 200 |" in (tmp_path / "streams.md").read_text()
    assert (tmp_path / "streams.png").stat().st_size > 0
    assert "all points:" in (tmp_path / "output.txt").read_text()


def test_a_missing_work_gauge_is_an_error_not_a_zero() -> None:
    metrics = 'kvgate_resident_sequences{pool="p"} 3.0\nkvgate_queued_requests 0.0\n'
    with pytest.raises(RuntimeError, match="kvgate_pending_prompt_tokens"):
        work_gauges(metrics)
