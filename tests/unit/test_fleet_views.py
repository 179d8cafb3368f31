"""The fleet's views are reused while nothing in them changed and rebuilt when anything did."""

from __future__ import annotations

from typing import Any

from kvgate.admission.cost import CostEstimate
from kvgate.config.loader import parse_config
from kvgate.gateway.replicas.fleet import Fleet
from kvgate.gateway.request_path.decision_path import DecisionPath
from kvgate.gateway.state import GatewayState
from kvgate.gateway.telemetry.metrics import GatewayMetrics
from kvgate.routing.health import Outcome
from kvgate.vocabulary.replica import ScrapedMetrics

URLS = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]


def fleet(kv_capacity_tokens: int | None = 10000) -> tuple[Fleet, GatewayState]:
    pool: dict[str, Any] = {"name": "p", "replicas": URLS}
    if kv_capacity_tokens is not None:
        pool["kv_capacity_tokens"] = kv_capacity_tokens
    config = parse_config(
        {"models": [{"name": "m", "max_model_len": 8192, "kv_bytes_per_token": 1}], "pools": [pool]}, {}
    )
    state = GatewayState.from_config(config)
    clock_s = 100.0
    return DecisionPath.build(state, config, GatewayMetrics(), clock=lambda: clock_s).fleet, state


def test_unchanged_views_are_reused_and_each_change_rebuilds_only_its_replica() -> None:
    f, state = fleet()
    first, second = state.replicas[URLS[0]], state.replicas[URLS[1]]
    before = f.views(100.0)
    again = f.views(100.0)
    assert [a is b for a, b in zip(before, again, strict=True)] == [True, True]

    f.observe_outcome(first, Outcome.SUCCESS)
    healthy = f.views(100.0)
    assert healthy[0].healthy and healthy[0].ready_since_s == 100.0
    assert healthy[1] is before[1]

    state.ledger.reserve("r1", URLS[1], CostEstimate("m", 100, 50, 1), 100.0)
    loaded = f.views(100.0)
    assert loaded[1].load.reserved_kv_tokens == 160 and loaded[0] is healthy[0]  # 150 in whole blocks

    first.ttft_ewma_s = 0.2
    second.scraped = ScrapedMetrics(0.5, 1, 0, None, None, 100.0)
    changed = f.views(100.0)
    assert changed[0].ttft_ewma_s == 0.2 and changed[1].scraped is second.scraped

    state.set_pool_urls("p", URLS[:1])
    assert [v.replica_id for v in f.views(100.0)] == URLS[:1]
    state.set_pool_urls("p", URLS)
    assert f.views(100.0)[1].scraped is None


def test_a_replica_of_unknown_capacity_is_not_routable_until_it_tells_its_capacity() -> None:
    f, state = fleet(kv_capacity_tokens=None)
    first = state.replicas[URLS[0]]
    f.observe_outcome(first, Outcome.SUCCESS)
    unknown = f.views(100.0)[0]
    assert first.healthy and not unknown.healthy, "probed healthy, yet no capacity to admit against"
    assert first.discover_capacity(4000) is False, "nothing configured to disagree with"
    learned = f.views(100.0)[0]
    assert learned.healthy and learned.kv_capacity_tokens == 4000
    assert f.views(100.0)[0] is learned
    first.discover_capacity(8000)
    assert f.views(100.0)[0].kv_capacity_tokens == 8000, "a replica restarted with more KV is seen"
    first.discover_capacity(None)
    assert first.kv_capacity_tokens == 8000, "a page without cache_config_info forgets nothing"


def test_a_configured_capacity_wins_and_each_new_disagreement_is_reported_once() -> None:
    f, state = fleet(kv_capacity_tokens=10000)
    first = state.replicas[URLS[0]]
    f.observe_outcome(first, Outcome.SUCCESS)
    assert f.views(100.0)[0].kv_capacity_tokens == 10000, "routable on the configured value at once"
    assert first.discover_capacity(10000) is False
    assert not first.capacity_disagrees
    assert [first.discover_capacity(4000) for _ in range(3)] == [True, False, False]
    assert first.capacity_disagrees and first.discovered_kv_capacity_tokens == 4000
    assert first.kv_capacity_tokens == 10000 and f.views(100.0)[0].kv_capacity_tokens == 10000
    assert first.discover_capacity(5000) is True, "another value is another warning"
    assert first.discover_capacity(10000) is False and not first.capacity_disagrees
