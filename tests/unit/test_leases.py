"""Lease renewal spread over ticks: every served request's reservation is renewed once per pass, at
most ``RENEWALS_PER_TICK`` an upkeep, so ten thousand open streams never stall one tick."""

from __future__ import annotations

from kvgate.admission.cost import CostEstimate
from kvgate.config.loader import parse_config
from kvgate.gateway.request_path.leases import RENEWALS_PER_TICK, Leases
from kvgate.gateway.state import GatewayState, ProxyRequest
from kvgate.gateway.telemetry.metrics import GatewayMetrics

REPLICA = "http://10.0.0.1:8000"
LEASE_S = 30.0


def served(count: int) -> tuple[GatewayState, Leases, list[ProxyRequest]]:
    config = parse_config(
        {
            "models": [{"name": "m", "max_model_len": 4096, "kv_bytes_per_token": 1}],
            "pools": [{"name": "p", "replicas": [REPLICA], "kv_capacity_tokens": 10_000_000}],
            "admission": {"reservation_lease_s": LEASE_S, "max_active_sequences_per_replica": 100_000},
        },
        {},
    )
    state = GatewayState.from_config(config)
    leases = Leases(state, GatewayMetrics(), lambda model: "p", now_s=0.0)
    requests = []
    for i in range(count):
        request = ProxyRequest(f"r{i}", f"r{i}", "/v1/completions", "m", True, {}, b"", [], [])
        assert state.ledger.reserve(request.request_id, REPLICA, CostEstimate("m", 10, 10, 1), 0.0)
        leases.hold(request)
        requests.append(request)
    return state, leases, requests


def test_a_pass_renews_every_served_request_a_batch_per_tick_and_leaves_a_leak_to_run_out() -> None:
    state, leases, requests = served(2 * RENEWALS_PER_TICK + 100)
    requests[0].finished = True  # finished without releasing: a leak
    renewed_at: dict[str, float] = {}
    now_s = LEASE_S / 3
    ticks = 0
    while len(renewed_at) < len(requests) - 1 and ticks < 10:
        now_s += 0.05
        ticks += 1
        before = {r.request_id: state.ledger.get(r.request_id) for r in requests}
        leases.upkeep(now_s)
        fresh = [
            rid
            for rid, held in before.items()
            if held is not None and state.ledger.get(rid) is not None and state.ledger.get(rid) != held
        ]
        assert len(fresh) <= RENEWALS_PER_TICK
        renewed_at.update((rid, now_s) for rid in fresh)
    assert ticks == 3 and "r0" not in renewed_at and len(renewed_at) == len(requests) - 1
    assert leases.upkeep(LEASE_S + 1.0)  # the leak's lease ran out; the renewed ones did not
    assert state.ledger.get("r0") is None
    assert all(state.ledger.get(r.request_id) is not None for r in requests[1:])
