"""Replaying a Mooncake-format trace: parsing, windows, block texts that share exactly what the ids
share, and the reuse ceiling a router's hit rate is read against."""

from __future__ import annotations

import itertools
from pathlib import Path

import orjson
import pytest

from kvgate.admission.tokenizer import TiktokenTokenizer
from kvgate.loadtest.mooncake import BlockText, MooncakeRequest, mooncake_trace, read_mooncake, window
from kvgate.loadtest.report import Slo
from kvgate.loadtest.reuse import reuse_ceiling
from kvgate.loadtest.workload import Workload

TOKENIZER = TiktokenTokenizer.from_name()


def request(ts_ms: float, ids: tuple[int, ...], last: int = 512, output: int = 10) -> MooncakeRequest:
    return MooncakeRequest(ts_ms, 512 * (len(ids) - 1) + last, output, ids)


def write(tmp_path: Path, rows: list[object]) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(row) for row in rows) + b"\n")
    return path


def test_a_trace_reads_in_file_order_and_a_bad_line_is_named(tmp_path: Path) -> None:
    good = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}
    assert read_mooncake(write(tmp_path, [good, {**good, "timestamp": 1500}]))[1].timestamp_ms == 1500
    bad_rows = [
        {**good, "hash_ids": [1]},
        {**good, "input_length": 0},
        {**good, "timestamp": -1},
        {**good, "hash_ids": ["a", "b"]},
        [1, 2],
    ]
    for bad in bad_rows:
        with pytest.raises(ValueError, match=r"trace.jsonl:2: "):
            read_mooncake(write(tmp_path, [good, bad]))
    with pytest.raises(ValueError, match="no requests"):
        read_mooncake(write(tmp_path, []))


def test_a_window_keeps_the_requests_arriving_inside_it() -> None:
    requests = [request(ms, (i,)) for i, ms in enumerate((0, 999, 1000, 2500, 4000))]
    assert [r.timestamp_ms for r in window(requests, 1.0, 2.0)] == [1000, 2500]
    assert len(window(requests, 0.0, None)) == 5


def test_requests_sharing_k_ids_share_exactly_k_blocks_of_tokens() -> None:
    blocks = BlockText(TOKENIZER)
    requests = [request(0, (1, 2, 3), last=100), request(0, (1, 2, 4, 5), last=511)]
    requests.append(request(0, (1, 7), last=3))
    ids = [TOKENIZER.encode(blocks.prompt(r)) for r in requests]
    assert [len(i) for i in ids] == [r.input_length for r in requests]
    for (a, ia), (b, ib) in itertools.combinations(zip(requests, ids, strict=True), 2):
        shared = next(k for k in itertools.count() if a.hash_ids[k] != b.hash_ids[k])
        common = next(n for n in itertools.count() if n == min(len(ia), len(ib)) or ia[n] != ib[n])
        assert common >= 512 * shared
    again, salted = BlockText(TOKENIZER), BlockText(TOKENIZER, salt=1)
    assert blocks.text(1, 512) == again.text(1, 512) != salted.text(1, 512)


def test_the_trace_sends_at_the_replay_speed_with_the_traces_lengths() -> None:
    workload = Workload(name="replay", classes=(), api="completions")
    requests = [request(1000, (1,), last=300, output=7), request(5000, (1, 2), last=40_000 - 512)]
    trace = mooncake_trace(requests, workload, BlockText(TOKENIZER), speed=2.0)
    assert [r.at_s for r in trace.requests] == [0.0, 2.0]
    assert trace.duration_s == 2.0
    first = trace.requests[0]
    assert (first.prompt_tokens, first.max_tokens, first.api) == (300, 7, "completions")
    assert first.payload["ignore_eos"] is True and first.payload["stream"] is True
    assert [r.class_name for r in trace.requests] == ["short", "long"]
    with pytest.raises(ValueError, match="speed"):
        mooncake_trace(requests, workload, BlockText(TOKENIZER), speed=0)


def test_the_reuse_ceiling_counts_leading_hits_and_forgets_what_a_small_cache_cannot_hold() -> None:
    requests = [request(0, (1, 2)), request(1, (1, 2, 3)), request(2, (9, 2)), request(3, (1, 2, 3))]
    big = reuse_ceiling(requests, 10**9)
    # 2nd: blocks 1-2 (1,024 tokens); 3rd: nothing (its first block differs); 4th: 1,535 (all but one token)
    assert (big.queried_tokens, big.hit_tokens) == (512 * 10, 1024 + 1535)
    assert big.hit_ratio == pytest.approx(2559 / 5120)
    small = reuse_ceiling(requests, 1100)
    assert small.hit_tokens < big.hit_tokens
    assert reuse_ceiling(requests, 0).hit_tokens == 0


def test_a_prompt_length_grows_the_ttft_objective() -> None:
    slo = Slo(1.0, 0.05, 1 / 16000)
    assert slo.ttft_budget_s(32_000) == pytest.approx(3.0)
    assert Slo(1.0, 0.05).ttft_budget_s(32_000) == 1.0
