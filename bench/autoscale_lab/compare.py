"""One scenario, every scaler, one seed: the runs the table and the plot are made of.

The fleet is the routing lab's replica (``FLEET_OVERRIDES`` without its warm-up override: the
profile's 60 s cold start and 30 s warm-up at up to 1.5x step time stay) behind the gateway's
default routing (its 60 s ramp included). Every scaler starts from the same fleet (what the oracle
needs at the start) and is evaluated every 15 s (``AutoscalerConfig``'s default interval). kvgate's
policy runs with ``PoolPolicy``'s defaults plus what its documentation asks an operator to
configure: the cold start (to serving at speed: cold start plus warm-up) and the per-replica
capacities, here the ones ``calibrate`` measures. The baselines' targets come from the same
measurement: 75 % of the base mix's requests/s one replica carries, 75 % busy, a quarter of the
replica's sequence slots waiting.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from bench.autoscale_lab import oracle as oracle_mod
from bench.autoscale_lab.loop import run
from bench.autoscale_lab.records import LabRun, LabSettings, Scaler
from bench.autoscale_lab.scalers import Kvgate, follow, request_rate, utilization, waiting
from bench.autoscale_lab.scenarios import BASE_MIX, CLASSES, SCENARIOS, Arrival
from bench.routing_lab.traces import FLEET_OVERRIDES, SLO_ITL_S, SLO_TTFT_S
from kvgate.config.autoscaler import ForecastPolicy, PoolPolicy
from kvgate.sim.profile import Profile, resolve_profile

SEED = 0
INTERVAL_S = 15.0
MAX_REPLICAS = 16
TARGET_UTILIZATION_RATIO = 0.75
ORACLE_SLO_RATIO = 0.99
"""The oracle's schedule is the leanest reaching this share of good requests."""
POLICIES = ("kvgate", "kvgate_forecast", "request_rate", "utilization", "waiting")
FORECAST_BUCKET_S = 30.0
"""The forecast's profile slot in the lab: a 30 s window of the oracle's, a twentieth of a lab day."""
FORECAST_TREND_WINDOW_S = 60.0


def lab_profile() -> Profile:
    return resolve_profile(overrides={k: v for k, v in FLEET_OVERRIDES.items() if k != "warmup_s"})


@dataclass(frozen=True, slots=True)
class ScenarioResult:
    scenario: str
    runs: Mapping[str, LabRun]
    """By scaler name, ``oracle`` included."""
    work: tuple[float, ...]
    """Replicas' worth of work per ``oracle.WINDOW_S`` window at full utilisation."""
    oracle: oracle_mod.OracleChoice
    reasons: tuple[str, ...]
    """kvgate's reason per evaluation."""


def good_ratio(result: LabRun) -> float:
    outcomes = result.outcomes
    return sum(1 for o in outcomes if o.good(SLO_TTFT_S, SLO_ITL_S)) / len(outcomes) if outcomes else 0.0


def base_mix_rps(capacity: oracle_mod.Capacity) -> float:
    """Requests/s of the base mix one replica carries at full utilisation, from the class means."""
    rng = random.Random(0)
    total = sum(BASE_MIX.values())
    per_request = 0.0
    for name, weight in BASE_MIX.items():
        draws = [CLASSES[name](rng) for _ in range(2000)]
        costs = [max(capacity.replica_seconds(p, o)) for p, o in draws]
        per_request += weight / total * sum(costs) / len(costs)
    return 1.0 / per_request


def scalers(
    capacity: oracle_mod.Capacity, profile: Profile, day_s: float | None = None
) -> dict[str, Callable[[], Scaler]]:
    """Every scaler; ``kvgate_forecast`` is kvgate's policy with its forecast on, its season the
    scenario's day (``day_s``; a scenario that does not repeat is one day, seen once)."""
    policy = PoolPolicy(
        min_replicas=1,
        max_replicas=MAX_REPLICAS,
        cold_start_s=profile.cold_start_s + profile.warmup_s,
        prefill_capacity_tokens_per_s=capacity.prefill_tokens_per_s,
        decode_capacity_tokens_per_s=capacity.decode_tokens_per_s,
    )
    rps = TARGET_UTILIZATION_RATIO * base_mix_rps(capacity)
    forecast = ForecastPolicy(
        enabled=True,
        season_s=day_s or 86400.0,
        bucket_s=FORECAST_BUCKET_S,
        trend_window_s=FORECAST_TREND_WINDOW_S,
    )
    foresighted = policy.model_copy(update={"forecast": forecast})
    return {
        "kvgate": lambda: Kvgate(policy),
        "kvgate_forecast": lambda: Kvgate(foresighted),
        "request_rate": lambda: request_rate(rps),
        "utilization": lambda: utilization(TARGET_UTILIZATION_RATIO),
        "waiting": lambda: waiting(profile.max_num_seqs / 4),
    }


@dataclass(frozen=True, slots=True)
class _Trace:
    """One scenario's arrivals on one seed, the fleet they play on and the work they demand."""

    profile: Profile
    capacity: oracle_mod.Capacity
    arrivals: Sequence[Arrival]
    work: Sequence[float]
    duration_s: float
    seed: int
    history_s: float = 0.0
    """Measured from here (a week's first day is history only)."""

    def play(self, scaler: Scaler, initial_replicas: int, name: str) -> LabRun:
        result = run(self.arrivals, scaler, self.settings(initial_replicas), self.duration_s, name)
        return result.since(self.history_s)

    def settings(self, initial_replicas: int) -> LabSettings:
        return LabSettings(
            self.profile,
            interval_s=INTERVAL_S,
            initial_replicas=initial_replicas,
            max_replicas=MAX_REPLICAS,
            seed=self.seed,
        )


def _trace(name: str, seed: int) -> _Trace:
    scenario = SCENARIOS[name]
    profile = lab_profile()
    capacity = oracle_mod.calibrate(profile)
    arrivals = scenario.arrivals(seed)
    work = oracle_mod.load(arrivals, capacity, scenario.duration_s)
    return _Trace(profile, capacity, arrivals, work, scenario.duration_s, seed, scenario.history_s)


def run_scenario(
    name: str,
    seed: int = SEED,
    policies: Sequence[str] = POLICIES,
    progress: Callable[[str], None] = lambda line: None,
    kvgate_policy: PoolPolicy | None = None,
    oracle_headroom: float | None = None,
) -> ScenarioResult:
    """Every scaler of ``policies`` and the oracle through ``name``'s trace; ``oracle_headroom``
    fixes the oracle's headroom instead of searching for it."""
    trace = _trace(name, seed)
    profile, capacity, work = trace.profile, trace.capacity, trace.work
    lead_s = profile.cold_start_s + INTERVAL_S
    step_s = oracle_mod.WINDOW_S

    oracle_runs: dict[tuple[int, ...], LabRun] = {}

    def play_schedule(plan: Sequence[int]) -> float:
        started = time.perf_counter()
        result = trace.play(follow(plan, step_s, lead_s), max(plan[:2]), "oracle")
        oracle_runs[tuple(plan)] = result
        progress(f"  {name:<10} oracle try   {_line(result, started)}")
        return good_ratio(result)

    if oracle_headroom is None:
        choice = oracle_mod.search(play_schedule, work, ORACLE_SLO_RATIO, 1, MAX_REPLICAS)
    else:
        plan = oracle_mod.schedule(work, oracle_headroom, 1, MAX_REPLICAS)
        choice = oracle_mod.OracleChoice(
            oracle_headroom, tuple(plan), ((oracle_headroom, play_schedule(plan)),)
        )
    runs = {"oracle": oracle_runs[choice.schedule]}
    initial = max(choice.schedule[:2])
    makers = scalers(capacity, profile, SCENARIOS[name].day_s or trace.duration_s)
    reasons: tuple[str, ...] = ()
    for policy_name in policies:
        scaler = Kvgate(kvgate_policy) if policy_name == "kvgate" and kvgate_policy else makers[policy_name]()
        started = time.perf_counter()
        result = trace.play(scaler, initial, policy_name)
        runs[policy_name] = result
        if isinstance(scaler, Kvgate):
            reasons = tuple(scaler.reasons)
        progress(f"  {name:<10} {policy_name:<12} {_line(result, started)}")
    return ScenarioResult(name, runs, tuple(work), choice, reasons)


@dataclass(frozen=True, slots=True)
class PresentOnly:
    """The oracle's schedule at one headroom, followed with no lead: what the best scaler without
    foresight could do."""

    headroom_ratio: float
    run: LabRun


def present_only(
    name: str,
    headrooms: Sequence[float],
    seed: int = SEED,
    progress: Callable[[str], None] = lambda line: None,
) -> list[PresentOnly]:
    """The oracle's schedule at each of ``headrooms``, asked for at the start of each window rather
    than a cold start ahead.

    It knows each window's demand the instant the window begins, which no reactive scaler does (it
    sees arrivals only as they come, through signals that lag them), so what it cannot reach at a
    given cost no reactive policy reaches: the bound of a target such as 99 % of the oracle's good
    at 1.25x its replica-seconds, where a step of demand comes within a cold start."""
    trace = _trace(name, seed)
    out: list[PresentOnly] = []
    for headroom in headrooms:
        plan = oracle_mod.schedule(trace.work, headroom, 1, MAX_REPLICAS)
        started = time.perf_counter()
        result = trace.play(follow(plan, oracle_mod.WINDOW_S, 0.0), max(plan[:2]), "present")
        out.append(PresentOnly(headroom, result))
        progress(f"  {name:<10} present {headroom:.2f} {_line(result, started)}")
    return out


def _line(result: LabRun, started: float) -> str:
    peak = max((t.desired for t in result.ticks), default=0)
    return (
        f"good {100 * good_ratio(result):5.1f} %  replica-s {result.replica_seconds:7.0f}  peak {peak:2d}  "
        f"({time.perf_counter() - started:.1f} s)"
    )
