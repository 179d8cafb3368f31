"""Replicas' worth of work in one sample: the pure arithmetic the policy sizes a pool with.

A phase's demand over its configured capacity is a share of a replica, added up on a mixed pool whose
phases share each replica's time (``work_share``). Two readings build on it without any history of
the policy's own: the demand a forecast learns (``present_demand``: what the pool needs now, no
projection and no backlog, since the profile is of demand, not of the fleet's shortfall), and the
replicas a pool bound by its KV cache rather than its compute needs (``kv_bound_replicas``), which
its served rates cannot show. Pure: values in, values out.
"""

from __future__ import annotations

import math

from kvgate.autoscaler.rules import prefill_per_replica
from kvgate.autoscaler.signals import PoolSignals
from kvgate.autoscaler.trend import slope
from kvgate.config.autoscaler import PoolPolicy
from kvgate.vocabulary.replica import Role

KV_BOUND_RATIO = 1.5
"""A pool whose KV in use is this many times the replicas' worth its served rates keep busy is bound
by its cache, not its compute."""
KV_BOUND_BACKLOG_RATIO = 0.5
"""Of ``scale_out_prefill_tokens_per_replica``: prompt tokens waiting per ready replica above which a
pool bound by its cache is short of it (one long context pending is below it)."""


def work_share(p: PoolPolicy, s: PoolSignals, prefill_rate: float, decode_rate: float) -> float | None:
    """Replicas' worth of work at full use: each configured phase's rate over its capacity,
    added up on a mixed pool (its phases share each replica's time); None with no capacity."""
    share, configured = 0.0, False
    if p.prefill_capacity_tokens_per_s is not None and s.role in (Role.PREFILL, Role.MIXED):
        share += prefill_rate / p.prefill_capacity_tokens_per_s
        configured = True
    if p.decode_capacity_tokens_per_s is not None and s.role in (Role.DECODE, Role.MIXED):
        share += decode_rate / p.decode_capacity_tokens_per_s
        configured = True
    return share if configured else None


def present_demand(p: PoolPolicy, s: PoolSignals, previous: tuple[float, int] | None) -> float:
    """Replicas the present demand needs at the targets, as the forecast learns it: the served
    rates plus the arrivals left waiting (the growth of the prompt tokens waiting since the
    ``previous`` sample, whatever the policy's windows), or the KV in use under the full mark,
    whichever needs more."""
    unserved = 0.0
    if previous is not None and s.time_s > previous[0]:
        unserved = max(0.0, (s.prompt_tokens_queued - previous[1]) / (s.time_s - previous[0]))
    output = s.output_tokens_per_s
    if s.prompt_tokens_per_s > 0:
        output *= 1 + unserved / s.prompt_tokens_per_s
    share = work_share(p, s, s.prompt_tokens_per_s + unserved, output)
    kv = s.kv_occupancy_ratio * s.replicas_ready / p.scale_out_occupancy_ratio
    return max(kv, share / p.target_utilization_ratio if share is not None else 0.0)


def kv_bound_replicas(p: PoolPolicy, s: PoolSignals, queued: list[tuple[float, float]]) -> int:
    """Replicas a pool whose prompts wait for KV room rather than for compute needs (0 when it is
    not such a pool): its ready replicas serve at their ceiling, so it needs them in the ratio of
    the prompt tokens arriving (served, plus the growth of those waiting, the least-squares slope of
    ``queued`` over ``scale_out_window_s``, plus those waiting over ``backlog_drain_s`` and
    ``cold_start_s``) to those served. Such a pool holds more than ``KV_BOUND_BACKLOG_RATIO`` of
    ``scale_out_prefill_tokens_per_replica`` waiting per ready replica, its served rates fill less
    than ``target_utilization_ratio`` of its replicas, and its KV in use is ``KV_BOUND_RATIO`` times
    what they keep busy: long contexts take a replica's cache one or two at a time, a cache too
    fragmented to take the next one reads under the full mark, and the KV in use never shows the
    queue behind it."""
    ready = s.replicas_ready
    served = s.prompt_tokens_per_s
    if (
        served <= 0
        or ready == 0
        or prefill_per_replica(s) <= KV_BOUND_BACKLOG_RATIO * p.scale_out_prefill_tokens_per_replica
    ):
        return 0
    busy = work_share(p, s, served, s.output_tokens_per_s)
    kv = s.kv_occupancy_ratio * ready
    if (
        busy is None
        or busy >= ready * p.target_utilization_ratio
        or kv < KV_BOUND_RATIO * busy
        or s.kv_occupancy_ratio < p.scale_in_occupancy_ratio
    ):
        # Not bound by its cache: compute is busy, or the cache is not past the idle mark (a
        # backlog the served rates have not caught up with yet, behind a step of demand).
        return 0
    growth = max(0.0, slope(queued)) if len(queued) >= 3 else 0.0
    arriving = served + growth + s.prompt_tokens_queued / (p.backlog_drain_s + p.cold_start_s)
    return math.ceil(ready * arriving / served - 1e-9)


def kv_share(s: PoolSignals, unserved: float) -> float:
    """Replicas' worth of KV cache in use, grown by the ``unserved`` arrivals the pool leaves
    waiting (prompt tokens/s), at most doubled per evaluation as an HPA's scale-up is (the served
    rate lags a shift of the mix by its window, the queue does not): a pool bound by KV rather than
    by tokens/s shows its demand only there."""
    waiting = 1 + unserved / max(s.prompt_tokens_per_s, unserved) if unserved > 0 else 1.0
    return s.kv_occupancy_ratio * s.replicas_ready * waiting
