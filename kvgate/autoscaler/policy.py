"""Desired replicas per pool from a history of work signals, with the reason of each decision.

Scale-out needs a *conjunction* held without a break for ``scale_out_window_s``: a pool that is
full (KV occupancy, or for a prefill pool prompt tokens waiting per replica) *and* slow for its
phase (TTFT for prefill, ITL for decode); high occupancy with fast tokens is a replica efficiently
full, and slow tokens with free cache is a configuration problem, so either alone is not enough.
A mixed pool is judged on both phases and takes the larger answer. Admission-queue wait above its
target on a full pool is demand the fleet is not serving (on a pool with room it is the tail of a
backlog already being cleared, still inside the latency window). Scale-in needs every phase
idle and fast for the much longer ``scale_in_window_s``, never within ``scale_down_delay_s`` of a
scale-out, and removes a smaller step: being short costs client-visible failures, being long costs
money. With per-replica capacities configured, sizing sets a floor that applies at once: each
phase's demand over its capacity is a share of a replica (added up on a mixed pool, whose phases
share each replica's time), ``N = ceil(share / U_target)``; demand is the served rate plus what
arrives unserved (the growth of the prompt tokens waiting: a saturated pool serves at its ceiling
whatever arrives; on a pool within every latency target, prompts its ready replicas hold within
``scale_out_prefill_tokens_per_replica`` each are in flight, not a backlog), projected over the
cold start at the growth of the share (not of each phase: a mix moving work from prompts to
outputs is no growth; and only over samples with every latency under its target: a hurried pool's
served rates are its ceiling), plus for prefill the backlog the asked-for replicas will find
(waiting now plus unserved arrivals until they serve) spread over ``backlog_drain_s``; the KV in
use (occupancy x ready replicas, grown by the waiting arrivals) must stay under the full mark;
resident sequences over per-replica capacity bound decode. The same
sizing, the KV in use also projected over the cold start at its growth and the served work at
its fall too (a replica removed is gone at once, one added back serves a cold start later), with a
hysteresis of twice the noise of that work around its trend over the window, at most
``scale_in_hysteresis_replicas``, scales the pool in, to the demand at the window's least-squares
line now (the hysteresis covers the noise around it; the most any sample needed counted it twice),
never below the sample's own (a line lags a demand that turns back up: the sample is what arrives
now), and the most KV in use a sample of the window held (it swings by replicas between reads), once it
has held for ``scale_in_sizing_window_s`` with every latency under its scale-out target: the
hysteresis is in replicas, as the noise of the rates is, and as wide as the noise measured (a slow
ramp's steady fall is trend, not noise), and a pool whose long prompts keep TTFT above the idle
rule's mark still scales in. Within
``scale_down_delay_s`` after a step in, the floor is the lowest of the last ``scale_out_window_s``
of samples: undoing a step in takes the evidence a scale-out conjunction takes, so the fleet turns
at most once per window; unless the KV in use has grown over ``scale_down_delay_s`` (sessions
filling the cache), when two samples above the fewer replicas are demand. On a pool within every
latency target with no backlog growing, a floor from the served rates alone takes two
samples too: one is as likely a cluster of long requests finishing together. A step in that would
be the fleet's second turn within ``scale_down_delay_s`` (the step out before it undid a step in)
waits for the window to pass. A change takes effect
when the ready replicas reach it (or one cold start later): until then the policy repeats its
answer instead of asking again (the backlog was sized into the ask), and afterwards every window
starts over. Pure: time comes from the samples.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from typing import NamedTuple

from kvgate.autoscaler.forecast import Forecaster, scheduled_replicas
from kvgate.autoscaler.recommendation import (
    HOLD,
    HOLD_COLD_START,
    HOLD_STABILIZING,
    MAX_REPLICAS,
    MIN_REPLICAS,
    SCALE_IN_IDLE,
    SCALE_IN_TOKEN_RATE,
    SCALE_OUT_FORECAST,
    SCALE_OUT_KV,
    SCALE_OUT_SCHEDULE,
    SCALE_OUT_SEQUENCES,
    SCALE_OUT_TOKEN_RATE,
    Recommendation,
    seconds_text,
)
from kvgate.autoscaler.rules import (
    backlogged,
    idle,
    replicas_for_rate,
    scale_out_reason,
    unhurried,
)
from kvgate.autoscaler.signals import PoolSignals
from kvgate.autoscaler.sizing import kv_bound_replicas, kv_share, present_demand, work_share
from kvgate.autoscaler.trend import residual, slope, trend_at
from kvgate.config.autoscaler import AutoscalerConfig, PoolPolicy
from kvgate.vocabulary.replica import Role

NOISE_SPREAD = 2.0
"""Standard deviations of the sizing window's work around its trend that the scale-in hysteresis
covers, up to ``scale_in_hysteresis_replicas``."""


class _RateSample(NamedTuple):
    """One settled sample of what the pool served and what waited."""

    time_s: float
    prompt_tokens_per_s: float
    output_tokens_per_s: float
    queued_tokens: int
    """Prompt tokens waiting."""
    backlog_tokens: int
    """Of those, the ones that are a backlog (``backlogged``)."""
    unhurried: bool


class PoolAutoscaler:
    """The policy for one pool: feed it samples in time order, read a recommendation per sample."""

    def __init__(self, pool: str, policy: PoolPolicy) -> None:
        self.pool = pool
        self.policy = policy
        self._rates: deque[_RateSample] = deque()
        """Samples since the last change took effect, over the growth window."""
        self._out_since_s: float | None = None
        self._out_reason: str | None = None
        self._in_since_s: float | None = None
        self._shrink_since_s: float | None = None
        self._sized = math.inf
        """Replicas the current sizing window needs with the scale-in hysteresis (inf: no
        capacities): its demand at its trend now, its KV in use at the most a sample held."""
        self._kv_sized = math.inf
        """The most replicas the KV in use of a sample of the current sizing window needs."""
        self._works: deque[tuple[float, float, float]] = deque()
        """(time, replicas' worth of demand, replicas' worth of KV in use) a step in must carry over the last
        ``scale_in_sizing_window_s`` since the last change: their spread around their trend is the
        noise the scale-in hysteresis absorbs."""
        self._kv_in_use: deque[tuple[float, float]] = deque()
        """(time, replicas' worth of KV in use) over the last ``scale_down_delay_s``, changes
        included: the KV sequences hold does not depend on how many replicas hold it."""
        self._floors: deque[tuple[float, int]] = deque()
        """(time, floor) over the last ``scale_out_window_s``: within ``scale_down_delay_s`` after a
        step in, the floor is the lowest of them."""
        self._last_in_s = -math.inf
        self._desired: int | None = None
        self._last_out_s = -math.inf
        self._settled_s: float | None = -math.inf
        """When the last change took effect (ready replicas reached the answer, or a cold start
        passed); None while it is still coming up."""
        self._changed_s = -math.inf
        self._turned_s = -math.inf
        """When a change last went the other way from the one before."""
        self._lead_s = policy.forecast.lead_s or policy.cold_start_s
        self._forecaster = Forecaster(policy.forecast, self._lead_s) if policy.forecast.enabled else None
        self._last_queued: tuple[float, int] | None = None
        self._foreseen_share: float | None = None
        """This sample's forecast in replicas' worth of work at full use (None: none)."""
        self._queued: deque[tuple[float, float]] = deque()
        """(time, prompt tokens waiting) over the last ``scale_out_window_s``, changes included."""

    def update(self, s: PoolSignals) -> Recommendation:
        p = self.policy
        now_s = s.time_s
        self._settle(s)
        self._track(s)
        forecast, error = self._foresee(s)
        self._foreseen_share = None if forecast is None else forecast * p.target_utilization_ratio
        self._queued.append((now_s, float(s.prompt_tokens_queued)))
        while self._queued[0][0] < now_s - p.scale_out_window_s:
            self._queued.popleft()
        settled = self._settled_s is not None
        base = s.replicas_current if settled or self._desired is None else self._desired
        floor, floor_reason, floor_detail = self._floor(s)
        previous = self._floors[-1][1] if self._floors else floor
        self._floors.append((now_s, floor))
        while self._floors[0][0] < now_s - p.scale_out_window_s:
            self._floors.popleft()
        if now_s - self._last_in_s < p.scale_down_delay_s:
            # KV in use growing over the stabilisation window is demand (sessions filling the cache):
            # two samples above the fewer replicas undo the step in; otherwise it is the noise of
            # large contexts coming and going, and undoing the step takes a scale-out window of it.
            floors = list(self._floors)[-2:] if self._kv_growth() > 0 else self._floors
            floor = min(f for _, f in floors)
        elif floor_reason == SCALE_OUT_TOKEN_RATE and unhurried(s, p) and self._unserved(backlog=True) == 0:
            # Served rates alone, on a pool within every latency target with no backlog growing:
            # one sample above the one before is as likely a cluster of long requests finishing
            # together as more demand, and waiting one sample for a second costs nothing the
            # latencies show.
            floor = min(floor, previous)
        # While asked-for replicas come up, the ask already covered the queue.
        kv_bound = 0 if self._settled_s is None else kv_bound_replicas(p, s, list(self._queued))
        if kv_bound > floor:
            # Prompts queued for KV room are not the noise of contexts coming and going between reads:
            # they count at once, a step in or a cold start before them.
            floor, floor_reason = kv_bound, SCALE_OUT_KV
            floor_detail += f" kv_bound->{kv_bound}"
        detail = (
            f"replicas={s.replicas_current} ready={s.replicas_ready} occupancy={s.kv_occupancy_ratio:.2f} "
            f"ttft_p95={seconds_text(s.ttft_p95_s)} itl_p95={seconds_text(s.itl_p95_s)} "
            f"queue_wait_p95={seconds_text(s.queue_wait_p95_s)} {floor_detail}"
        )
        desired, reason = base, HOLD
        if self._out_reason is not None and not settled:
            reason = HOLD_COLD_START
        elif self._out_reason is not None and self._held_s(self._out_since_s, now_s) >= p.scale_out_window_s:
            desired = max(base + max(1, math.ceil(base * p.scale_out_step_ratio)), floor)
            reason = self._out_reason
        if reason in (HOLD, HOLD_COLD_START) and floor > base:
            desired, reason = floor, floor_reason
        if reason == HOLD and self._held_s(self._in_since_s, now_s) >= p.scale_in_window_s:
            if now_s - self._last_out_s < p.scale_down_delay_s:
                reason = HOLD_STABILIZING
            elif base > max(floor, p.min_replicas):
                desired = max(base - max(1, math.floor(base * p.scale_in_step_ratio)), floor)
                reason = SCALE_IN_IDLE
        shrink_to = max(floor, self._sized, p.min_replicas)
        if (
            reason == HOLD
            and self._held_s(self._shrink_since_s, now_s) >= p.scale_in_sizing_window_s
            and base > shrink_to
        ):
            desired, reason = int(shrink_to), SCALE_IN_TOKEN_RATE
        if (
            desired < base
            and self._last_out_s > self._last_in_s
            and now_s - self._turned_s < p.scale_down_delay_s
        ):
            # The last change was a step out that undid a step in: a step in now would turn the
            # fleet twice within one stabilisation window.
            desired, reason = base, HOLD_STABILIZING
        scheduled = scheduled_replicas(p.forecast, now_s, self._lead_s)
        foreseen = max(scheduled, math.ceil(forecast - 1e-9) if forecast is not None else 0)
        if foreseen > desired:
            # Foresight is an input, never an answer below the present's: it only lifts the ask.
            desired, reason = foreseen, SCALE_OUT_SCHEDULE if scheduled == foreseen else SCALE_OUT_FORECAST
        if forecast is not None:
            detail += f" forecast={forecast:.2f}"
        if desired > p.max_replicas:
            desired, reason = p.max_replicas, MAX_REPLICAS
        if desired < p.min_replicas or (reason == HOLD and s.replicas_current < desired == p.min_replicas):
            # Also while the pool is still coming up to the floor: that is what holds it there.
            desired, reason = p.min_replicas, MIN_REPLICAS
        self._record(desired, s.replicas_current, now_s)
        return Recommendation(self.pool, desired, reason, detail, forecast, error)

    def _foresee(self, s: PoolSignals) -> tuple[float | None, float | None]:
        """The forecast of demand over the lead (None when off or without history) and the error of
        the latest forecast whose lead has passed, both in replicas."""
        previous, self._last_queued = self._last_queued, (s.time_s, s.prompt_tokens_queued)
        if self._forecaster is None:
            return None, None
        self._forecaster.observe(s.time_s, present_demand(self.policy, s, previous))
        return self._forecaster.forecast(s.time_s), self._forecaster.last_error_replicas

    def _settle(self, s: PoolSignals) -> None:
        if self._settled_s is None and (
            s.replicas_ready == self._desired or s.time_s - self._changed_s >= self.policy.cold_start_s
        ):
            self._settled_s = s.time_s

    def _track(self, s: PoolSignals) -> None:
        p = self.policy
        out = scale_out_reason(s, p)
        if out is None:
            self._out_since_s = None
        elif self._out_since_s is None:
            self._out_since_s = s.time_s
        self._out_reason = out
        if not idle(s, p):
            self._in_since_s = None
        elif self._in_since_s is None:
            self._in_since_s = s.time_s
        if self._settled_s is not None:
            self._rates.append(
                _RateSample(
                    s.time_s,
                    s.prompt_tokens_per_s,
                    s.output_tokens_per_s,
                    s.prompt_tokens_queued,
                    backlogged(s, p),
                    unhurried(s, p),
                )
            )
        while len(self._rates) > 2 and self._rates[1].time_s <= s.time_s - p.growth_window_s:
            self._rates.popleft()
        self._kv_in_use.append((s.time_s, s.kv_occupancy_ratio * s.replicas_ready))
        while self._kv_in_use[0][0] < s.time_s - p.scale_down_delay_s:
            self._kv_in_use.popleft()
        rates_sized, kv_sized = self._sized_for(s)
        sized = max(rates_sized, kv_sized)
        if not (sized < s.replicas_current and unhurried(s, p)):
            self._shrink_since_s = None
        elif self._shrink_since_s is None:
            self._shrink_since_s, self._sized, self._kv_sized = s.time_s, sized, kv_sized
        else:
            self._kv_sized = max(self._kv_sized, kv_sized)
            self._sized = max(rates_sized, self._kv_sized)

    def _held_s(self, since_s: float | None, now_s: float) -> float:
        """How long a condition has held, counting only since the last change took effect."""
        if since_s is None or self._settled_s is None:
            return -math.inf
        return now_s - max(since_s, self._settled_s)

    def _unserved(self, backlog: bool = False) -> float:
        """Prompt tokens/s arriving beyond what is served: the growth of the prompt tokens waiting
        since the previous sample (a saturated pool serves at its ceiling whatever arrives); with
        ``backlog``, of those that are a backlog only (``backlogged``)."""
        if len(self._rates) < 2:
            return 0.0
        previous, last = self._rates[-2], self._rates[-1]
        if last.time_s <= previous.time_s:
            return 0.0
        if backlog:
            grown = last.backlog_tokens - previous.backlog_tokens
        else:
            grown = last.queued_tokens - previous.queued_tokens
        return max(0.0, grown / (last.time_s - previous.time_s))

    def _projected_share(
        self, s: PoolSignals, unserved: float, backlog_tokens_per_s: float = 0.0, falling: bool = False
    ) -> float | None:
        """Replicas' worth of work expected one cold start from now (None with no capacity): the
        served rates, plus ``unserved`` prompt tokens/s (and the output of the waiting requests in the
        same proportion as their prompts), plus ``backlog_tokens_per_s`` of prompt, plus the growth of
        the served work over the cold start. The growth is the least-squares slope of the share
        itself, once samples span half the growth window, not of each phase: a mixed pool's phases
        share each replica's time, so a mix moving work from prompts to outputs is no growth, while
        each phase's rise alone would read as one. It is measured only at constant capacity (since
        the last change took effect) and over samples with every latency under its scale-out
        target: while replicas come up, and while a hurried pool serves at its ceiling, served
        rates rise with capacity, not with demand."""
        prompt = s.prompt_tokens_per_s + unserved + backlog_tokens_per_s
        output = s.output_tokens_per_s
        if s.prompt_tokens_per_s > 0:
            output *= 1 + unserved / s.prompt_tokens_per_s
        share = work_share(self.policy, s, prompt, output)
        if share is None:
            return None
        growth = self._share_growth(s)
        projected = share + (growth if falling else max(0.0, growth)) * self.policy.cold_start_s
        foreseen = self._foreseen_share
        if not falling and foreseen is not None and foreseen >= share:
            # The forecast holds this rise: the demand it learned for the next cold start bounds the
            # present's slope projected over it (a step served by replicas started ahead reads as
            # steep growth for a window). A present above the forecast projects as before.
            projected = min(projected, max(share, foreseen))
        return projected

    def _share_growth(self, s: PoolSignals) -> float:
        """Replicas' worth of served work gained per second over the growth window's unhurried
        samples (0 until they span half of it)."""
        rates = [r for r in self._rates if r.unhurried]
        if len(rates) < 2 or rates[-1].time_s - rates[0].time_s < self.policy.growth_window_s / 2:
            return 0.0
        return slope(
            [
                (r.time_s, work_share(self.policy, s, r.prompt_tokens_per_s, r.output_tokens_per_s) or 0.0)
                for r in rates
            ]
        )

    def _floor(self, s: PoolSignals) -> tuple[int, str, str]:
        p = self.policy
        best, reason, parts = 0, SCALE_OUT_TOKEN_RATE, []
        # A floor asks for replicas at once: prompts in flight on a pool within its targets are
        # neither a backlog nor arrivals left unserved.
        unserved = self._unserved(backlog=True)
        backlog = 0.0
        if self._settled_s is not None:
            # The backlog replicas asked for now will find: what waits now and what arrives unserved
            # until they serve. While asked-for replicas come up, that ask already covered it.
            backlog = (backlogged(s, p) + unserved * p.cold_start_s) / p.backlog_drain_s
        share = self._projected_share(s, unserved, backlog)
        if share is not None:
            best = replicas_for_rate(share, 1.0, p.target_utilization_ratio)
            parts.append(
                f"prefill_demand={s.prompt_tokens_per_s + unserved + backlog:.0f}/s "
                f"growth={self._share_growth(s):+.4f}/s replica_share={share:.2f}->{best}"
            )
            kv = kv_share(s, self._unserved())
            n = replicas_for_rate(kv, 1.0, p.scale_out_occupancy_ratio)
            parts.append(f"kv_share={kv:.2f}->{n}")
            if n > best:
                best, reason = n, SCALE_OUT_KV
        if p.decode_sequences_per_replica is not None and s.role in (Role.DECODE, Role.MIXED):
            n = math.ceil(s.resident_sequences / p.decode_sequences_per_replica)
            parts.append(f"resident_sequences={s.resident_sequences}->{n}")
            if n > best:
                best, reason = n, SCALE_OUT_SEQUENCES
        return best, reason, " ".join(parts)

    def _sized_for(self, s: PoolSignals) -> tuple[float, float]:
        """Replicas that carry the demand projected one cold start ahead (growth included, backlog
        not), and replicas that hold the KV in use projected the same way, its growth measured over
        ``scale_down_delay_s`` (sessions filling the cache while the token rates fall still need the
        replicas a step in would remove; over a shorter window a cache that only fluctuates reads
        as growing), each with the scale-in hysteresis; inf when no capacity is configured. The
        demand is the sizing window's least-squares line at ``s``, or the sample's own where higher
        (under three samples, the sample's): the hysteresis covers the noise around that line, and
        the most any sample needed would count it twice; a line lags a demand that falls and turns
        back up, and a step in to what the line reads would be short of what arrives now. The KV
        in use is the sample's: it swings by several replicas' worth between reads, and the step in
        keeps the most its window needed."""
        p = self.policy
        share = self._projected_share(s, self._unserved(), falling=True)
        if share is None:
            return math.inf, math.inf
        kv = kv_share(s, self._unserved()) + max(0.0, self._kv_growth()) * p.cold_start_s
        self._works.append((s.time_s, share, kv))
        while self._works[0][0] < s.time_s - p.scale_in_sizing_window_s:
            self._works.popleft()
        works = [(t, max(demand, held)) for t, demand, held in self._works]
        hysteresis = min(p.scale_in_hysteresis_replicas, NOISE_SPREAD * residual(works))
        shares = [(t, demand) for t, demand, _ in self._works]
        demand = max(trend_at(shares, s.time_s), share) if len(shares) >= 3 else share
        return (
            replicas_for_rate(demand + hysteresis, 1.0, p.target_utilization_ratio),
            replicas_for_rate(kv + hysteresis, 1.0, p.target_utilization_ratio),
        )

    def _kv_growth(self) -> float:
        """Replicas' worth of KV in use gained per second over ``scale_down_delay_s`` (0 until the
        samples span half of it): over a shorter window a cache that only fluctuates reads as
        growing."""
        kv = list(self._kv_in_use)
        if kv[-1][0] - kv[0][0] < self.policy.scale_down_delay_s / 2:
            return 0.0
        return slope(kv)

    def _record(self, desired: int, current: int, now_s: float) -> None:
        previous = self._desired if self._desired is not None else current
        if desired != previous:
            self._changed_s = now_s
            self._settled_s = None
            self._rates.clear()
            self._works.clear()
            self._shrink_since_s = None
            moved = max(self._last_out_s, self._last_in_s) > -math.inf
            if moved and (desired > previous) != (self._last_out_s > self._last_in_s):
                self._turned_s = now_s
            if desired > previous:
                self._last_out_s = now_s
            else:
                self._last_in_s = now_s
        self._desired = desired


class Autoscaler:
    """One ``PoolAutoscaler`` per pool, created on the pool's first sample."""

    def __init__(self, config: AutoscalerConfig) -> None:
        self.config = config
        self._pools: dict[str, PoolAutoscaler] = {}

    def update(self, samples: Iterable[PoolSignals]) -> list[Recommendation]:
        recommendations = []
        for s in samples:
            pool = self._pools.get(s.pool)
            if pool is None:
                pool = self._pools[s.pool] = PoolAutoscaler(s.pool, self.config.policy_for(s.pool))
            recommendations.append(pool.update(s))
        return recommendations
