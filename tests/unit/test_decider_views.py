"""The decider's fleet views are reused while nothing in them changed and rebuilt when anything did."""

from __future__ import annotations

from admission.cost import CostEstimate
from config.loader import parse_config
from gateway.decide import KvgateDecider
from gateway.metrics import GatewayMetrics
from gateway.state import GatewayState
from routing.health import Outcome
from routing.replica import ScrapedMetrics

URLS = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]


def decider() -> tuple[KvgateDecider, GatewayState]:
    config = parse_config(
        {
            "models": [{"name": "m", "max_model_len": 8192, "kv_bytes_per_token": 1}],
            "pools": [{"name": "p", "replicas": URLS, "kv_capacity_tokens": 10000}],
        },
        {},
    )
    state = GatewayState.from_config(config)
    clock_s = 100.0
    return KvgateDecider(state, config, GatewayMetrics(), clock=lambda: clock_s), state


def test_unchanged_views_are_reused_and_each_change_rebuilds_only_its_replica() -> None:
    d, state = decider()
    first, second = state.replicas[URLS[0]], state.replicas[URLS[1]]
    before = d.views(100.0)
    again = d.views(100.0)
    assert [a is b for a, b in zip(before, again, strict=True)] == [True, True]

    d.observe_outcome(first, Outcome.SUCCESS)
    healthy = d.views(100.0)
    assert healthy[0].healthy and healthy[0].ready_since_s == 100.0
    assert healthy[1] is before[1]

    state.ledger.reserve("r1", URLS[1], CostEstimate("m", 100, 50, 1), 100.0)
    loaded = d.views(100.0)
    assert loaded[1].load.reserved_kv_tokens == 150 and loaded[0] is healthy[0]

    first.ttft_ewma_s = 0.2
    second.scraped = ScrapedMetrics(0.5, 1, 0, None, None, 100.0)
    changed = d.views(100.0)
    assert changed[0].ttft_ewma_s == 0.2 and changed[1].scraped is second.scraped

    state.set_pool_urls("p", URLS[:1])
    assert [v.replica_id for v in d.views(100.0)] == URLS[:1]
    state.set_pool_urls("p", URLS)
    assert d.views(100.0)[1].scraped is None
