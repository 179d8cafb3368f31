"""The rules the policy reads one sample by: full, slow, idle, a backlog, and ``N = ceil(R / (C x U))``.

Each is a predicate on one pool's signals at one instant and its policy; the policy (``policy``)
holds them over windows of samples.
"""

from __future__ import annotations

import math

from kvgate.autoscaler.recommendation import (
    SCALE_OUT_BACKLOG_TTFT,
    SCALE_OUT_OCCUPANCY_ITL,
    SCALE_OUT_OCCUPANCY_TTFT,
    SCALE_OUT_QUEUE_WAIT,
)
from kvgate.autoscaler.signals import PoolSignals
from kvgate.config.autoscaler import PoolPolicy
from kvgate.vocabulary.replica import Role


def replicas_for_rate(rate_per_s: float, capacity_per_s: float, utilization_ratio: float) -> int:
    """``ceil(R / (C x U_target))``: replicas that carry ``rate_per_s`` at the target utilisation."""
    return math.ceil(rate_per_s / (capacity_per_s * utilization_ratio) - 1e-9)


def scale_out_reason(s: PoolSignals, p: PoolPolicy) -> str | None:
    """The first scale-out rule ``s`` satisfies at its instant, or None."""
    if s.role in (Role.PREFILL, Role.MIXED) and slow(s.ttft_p95_s, p.scale_out_ttft_s) and full(s, p):
        return SCALE_OUT_BACKLOG_TTFT if s.role is Role.PREFILL else SCALE_OUT_OCCUPANCY_TTFT
    if s.role in (Role.DECODE, Role.MIXED) and full(s, p) and slow(s.itl_p95_s, p.scale_out_itl_s):
        return SCALE_OUT_OCCUPANCY_ITL
    if slow(s.queue_wait_p95_s, p.scale_out_queue_wait_s) and full(s, p):
        return SCALE_OUT_QUEUE_WAIT
    return None


def full(s: PoolSignals, p: PoolPolicy) -> bool:
    """The pool's load half of a conjunction: prompt backlog for prefill, KV occupancy otherwise."""
    if s.role is Role.PREFILL:
        return prefill_per_replica(s) > p.scale_out_prefill_tokens_per_replica
    return s.kv_occupancy_ratio > p.scale_out_occupancy_ratio


def idle(s: PoolSignals, p: PoolPolicy) -> bool:
    """Every phase of the pool is both lightly loaded and fast at ``s``'s instant."""
    if slow(s.queue_wait_p95_s, p.scale_in_ttft_s):
        return False
    prefill_idle = fast(s.ttft_p95_s, p.scale_in_ttft_s) and (
        prefill_per_replica(s) < p.scale_in_prefill_tokens_per_replica
        if s.role is Role.PREFILL
        else s.kv_occupancy_ratio < p.scale_in_occupancy_ratio
    )
    decode_idle = s.kv_occupancy_ratio < p.scale_in_occupancy_ratio and fast(s.itl_p95_s, p.scale_in_itl_s)
    if s.role is Role.PREFILL:
        return prefill_idle
    if s.role is Role.DECODE:
        return decode_idle
    return prefill_idle and decode_idle


def unhurried(s: PoolSignals, p: PoolPolicy) -> bool:
    """No latency near its scale-out target: the served rates are the demand, not a ceiling the
    fleet imposes (a saturated pool's served rates fill its replicas and never fit fewer)."""
    return (
        fast(s.ttft_p95_s, p.scale_out_ttft_s)
        and fast(s.itl_p95_s, p.scale_out_itl_s)
        and fast(s.queue_wait_p95_s, p.scale_out_queue_wait_s)
    )


def slow(value_s: float | None, limit_s: float) -> bool:
    return value_s is not None and value_s > limit_s


def fast(value_s: float | None, limit_s: float) -> bool:
    return value_s is None or value_s < limit_s


def backlogged(s: PoolSignals, p: PoolPolicy) -> int:
    """Prompt tokens waiting that are a backlog: none on a pool within every latency target whose ready
    replicas hold them within ``scale_out_prefill_tokens_per_replica`` each, all of them otherwise.
    The first are prompts in flight (a document admitted and not yet prefilled, a 15 s read's snapshot
    of work served within its targets): counted as arrivals left unserved, 6.8k prompt tokens waiting
    on a one-replica pool asked for a second replica minutes before one was needed."""
    in_flight = p.scale_out_prefill_tokens_per_replica * s.replicas_ready
    if unhurried(s, p) and s.prompt_tokens_queued <= in_flight:
        return 0
    return s.prompt_tokens_queued


def prefill_per_replica(s: PoolSignals) -> float:
    return s.prompt_tokens_queued / max(1, s.replicas_ready)
