"""Production traces for the lab: a Mooncake-format file, or one of the shapes of ``bench.traces``.

A replay is judged as the prefix-routing issue judges it: four full Llama-3.1-8B H100 replicas,
TTFT within 1 s plus the prompt over 16k tokens a second, mean inter-token gap within 50 ms. Its
requests are the replay's own, rendered to token ids block by block (each block's ids computed once:
the blocks' texts concatenate exactly, ``kvgate.loadtest.mooncake``), so a replay of thousands of
long prompts is tokenised in seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.routing_lab.replay import KV_BYTES_PER_TOKEN, MODEL, LabRequest
from bench.traces.shapes import SHAPES
from kvgate.admission.tokenizer import TiktokenTokenizer
from kvgate.loadtest.mooncake import BlockText, MooncakeRequest, read_mooncake, window
from kvgate.routing.request import RoutingRequest

SLO_TTFT_S = 1.0
SLO_TTFT_PER_PROMPT_TOKEN_S = 1 / 16_000
SLO_ITL_S = 0.05


@dataclass(frozen=True, slots=True)
class Replay:
    name: str
    requests: Sequence[MooncakeRequest]
    speed: float = 1.0
    replicas: int = 4
    profile_overrides: Mapping[str, Any] = field(default_factory=lambda: {"warmup_s": 0})
    slo_ttft_s: float = SLO_TTFT_S
    slo_ttft_per_prompt_token_s: float = SLO_TTFT_PER_PROMPT_TOKEN_S
    slo_itl_s: float = SLO_ITL_S


def shaped(shape: str, rate_per_s: float, duration_s: float, seed: int) -> Replay:
    return Replay(f"{shape}@{rate_per_s:g}/s", SHAPES[shape](rate_per_s, duration_s, seed))


def from_file(path: Path, start_s: float, window_s: float | None, speed: float) -> Replay:
    requests = window(read_mooncake(path), start_s, window_s)
    return Replay(f"{path.stem}x{speed:g}", requests, speed=speed)


def replay_requests(replay: Replay) -> list[LabRequest]:
    tokenizer = TiktokenTokenizer.from_name()
    blocks = BlockText(tokenizer)
    ids_of: dict[tuple[int, int], list[int]] = {}
    first_ms = replay.requests[0].timestamp_ms if replay.requests else 0.0
    out = []
    for index, request in enumerate(replay.requests):
        ids: list[int] = []
        for hash_id, length in zip(request.hash_ids, request.block_lengths(), strict=True):
            key = (hash_id, length)
            block = ids_of.get(key)
            if block is None:
                block = ids_of[key] = tokenizer.encode(blocks.text(hash_id, length))
            ids += block
        routing = RoutingRequest.from_token_ids(MODEL, ids, request.output_length)
        routing = RoutingRequest(
            routing.model,
            routing.prompt_tokens,
            routing.max_output_tokens,
            routing.block_hashes,
            1,
            KV_BYTES_PER_TOKEN,
        )
        arrival_s = (request.timestamp_ms - first_ms) / 1000.0 / replay.speed
        out.append(LabRequest(index, _class(request.input_length), arrival_s, tuple(ids), routing))
    return out


def _class(prompt_tokens: int) -> str:
    if prompt_tokens < 4096:
        return "short"
    return "medium" if prompt_tokens < 32768 else "long"
