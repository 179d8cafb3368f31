"""The routing lab with a host-memory tier: a request whose prefix only host memory holds loads it
while its replica runs nothing else, and still gets its tokens (the lab steps an engine again when
a load ends, as the simulator's server does, not only when a step ends or a request arrives)."""

from __future__ import annotations

from bench.routing_lab.replay import MODEL, LabRequest, play
from kvgate.config.routing import RoutingConfig
from kvgate.routing.request import RoutingRequest
from kvgate.sim.profile import resolve_profile

PROMPT = tuple(range(4000))


def _request(index: int, arrival_s: float, token_ids: tuple[int, ...]) -> LabRequest:
    routing = RoutingRequest.from_token_ids(MODEL, token_ids, 4)
    return LabRequest(index, "lab", arrival_s, token_ids, routing)


def test_a_request_that_loads_its_prefix_on_an_idle_replica_gets_its_tokens() -> None:
    others = [
        _request(1 + i, 10.0 * (1 + i), tuple(range(100_000 * (i + 1), 100_000 * (i + 1) + 3000)))
        for i in range(3)
    ]
    requests = [_request(0, 0.0, PROMPT), *others, _request(4, 100.0, (*PROMPT, 1))]
    profile = resolve_profile(
        overrides={"warmup_s": 0, "kv_capacity_tokens": 6000, "cpu_offload_tokens": 40_000}
    )
    config = RoutingConfig.model_validate({"policy": "round_robin", "warmup_s": 0})

    result = play(requests, config, profile, 1, admission=False)

    last = result.outcomes[-1]
    assert last.tokens == 4 and last.ttft_s is not None
    load_s = 4000 * profile.kv_bytes_per_token / profile.cpu_offload_bytes_per_s
    assert last.ttft_s > load_s, "its prefix came from host memory, not the GPU cache"
    assert result.tiered_hit_ratio > result.hit_ratio
