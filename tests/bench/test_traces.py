"""The production-shaped traces: seeded, well-formed Mooncake rows, each shape reusing prompts its way."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.traces.__main__ import main
from bench.traces.shapes import SHAPES
from kvgate.loadtest.mooncake import BLOCK_TOKENS, read_mooncake
from kvgate.loadtest.reuse import reuse_ceiling


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_shape_is_seeded_and_every_request_is_a_valid_mooncake_row(shape: str) -> None:
    requests = SHAPES[shape](3.0, 60.0, 1)
    assert requests == SHAPES[shape](3.0, 60.0, 1)
    assert requests != SHAPES[shape](3.0, 60.0, 2)
    assert [r.timestamp_ms for r in requests] == sorted(r.timestamp_ms for r in requests)
    for r in requests:
        assert len(r.hash_ids) == -(-r.input_length // BLOCK_TOKENS) and r.output_length > 0


def test_each_shape_reuses_what_it_says() -> None:
    chat, rag, agent = (SHAPES[s](4.0, 300.0, 0) for s in ("chat-fleet", "rag", "agent"))
    assert all(r.hash_ids[:4] == chat[0].hash_ids[:4] for r in chat), "one fleet-wide system prompt"
    back = sum(
        1
        for r in chat
        if any(r.hash_ids[:5] == s.hash_ids[:5] for s in chat if s.timestamp_ms < r.timestamp_ms)
    )
    assert back > 0.15 * len(chat), "conversations come back, minutes later"
    assert reuse_ceiling(agent, 10**9).hit_ratio > reuse_ceiling(rag, 10**9).hit_ratio
    assert reuse_ceiling(rag, 10**9).hit_ratio > reuse_ceiling(chat, 10**9).hit_ratio > 0.1


def test_the_command_writes_a_trace_kvgate_loadtest_reads(tmp_path: Path) -> None:
    argv = ["--shape", "rag", "--rate", "2", "--duration-s", "20", "--out", str(tmp_path)]
    assert main(argv) == 0
    requests = read_mooncake(tmp_path / "rag.jsonl")
    assert requests and requests == read_mooncake(tmp_path / "rag.jsonl")
    printed = (tmp_path / "output.txt").read_text()
    assert f"{len(requests)} requests" in printed and "reuse ceiling" in printed
