"""What a run measured, and the table that sets it against the oracle, the baselines and the targets.

Per run: SLO attainment (the project's goodput: TTFT within 2 s and mean inter-token gap within
50 ms, a refused request counting as missed), replica-seconds (from the ask to the removal, over the
scenario), the peak asked for and its ratio to the oracle's peak (overshoot), time to scale out (from
the scenario's rise to the first ask above what the scaler had then), time to scale in (from its fall
to the first step down), and direction changes of the asked-for count, with the most inside any
300 s window (the stabilisation window). The targets are the issue's: against the oracle, SLO at
least 99 % of its and replica-seconds at most 1.25x; against each baseline at equal or better SLO,
at most 0.8x its replica-seconds on ``mix_shift`` and ``leak`` and no more on ``ramp`` and ``burst``
(a scaler whose SLO is at least a point better is not held to the baseline's cost); scale-in within
120 s of the fall; at most one direction change per window.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bench.autoscale_lab.compare import PresentOnly, ScenarioResult, good_ratio
from bench.autoscale_lab.records import LabRun
from bench.autoscale_lab.scenarios import SCENARIOS

STABILIZATION_WINDOW_S = 300.0
SCALE_IN_TARGET_S = 120.0
SLO_OF_ORACLE_RATIO = 0.99
COST_OF_ORACLE_RATIO = 1.25
COST_OF_BASELINE_RATIO = {"mix_shift": 0.8, "leak": 0.8, "ramp": 1.0, "burst": 1.0}
SLO_TIE_RATIO = 0.001
SLO_BETTER_RATIO = 0.01


@dataclass(frozen=True, slots=True)
class Measures:
    scaler: str
    good_ratio: float
    replica_seconds: float
    peak: int
    scale_out_s: float | None
    scale_in_s: float | None
    direction_changes: int
    most_changes_in_window: int
    refused: int
    preemptions: int


def measure(run: LabRun, rise_s: float, fall_s: float) -> Measures:
    ticks = run.ticks
    desired = [t.desired for t in ticks]
    before = [t.desired for t in ticks if t.time_s < rise_s]
    base = before[-1] if before else (desired[0] if desired else 0)
    scale_out = next((t.time_s - rise_s for t in ticks if t.time_s >= rise_s and t.desired > base), None)
    scale_in = next(
        (
            b.time_s - fall_s
            for a, b in itertools.pairwise(ticks)
            if b.time_s >= fall_s and b.desired < a.desired
        ),
        None,
    )
    turns = _direction_changes(ticks_s=[t.time_s for t in ticks], values=desired)
    most = max(
        (sum(1 for u in turns if t <= u < t + STABILIZATION_WINDOW_S) for t in turns),
        default=0,
    )
    return Measures(
        run.scaler,
        good_ratio(run),
        run.replica_seconds,
        max(desired, default=0),
        scale_out,
        scale_in,
        len(turns),
        most,
        sum(1 for o in run.outcomes if o.refused),
        run.preemptions,
    )


def _direction_changes(ticks_s: Sequence[float], values: Sequence[int]) -> list[float]:
    """Instants at which the asked-for count moved the other way from its previous move."""
    turns: list[float] = []
    last_sign = 0
    for t, a, b in zip(ticks_s[1:], values, values[1:], strict=False):
        sign = (b > a) - (b < a)
        if sign == 0:
            continue
        if last_sign and sign != last_sign:
            turns.append(t)
        last_sign = sign
    return turns


def scenario_measures(result: ScenarioResult) -> dict[str, Measures]:
    scenario = SCENARIOS[result.scenario]
    return {name: measure(run, scenario.rise_s, scenario.fall_s) for name, run in result.runs.items()}


def _s(value: float | None) -> str:
    return "never" if value is None else f"{value:.0f}"


def table(result: ScenarioResult) -> str:
    m = scenario_measures(result)
    oracle = m["oracle"]
    lines = [
        f"{result.scenario}: {SCENARIOS[result.scenario].description}",
        f"  oracle: headroom {result.oracle.headroom_ratio:.2f} "
        f"(tried {', '.join(f'{h:.2f}->{100 * g:.1f}%' for h, g in result.oracle.tried)})",
        f"  {'scaler':<13}{'good %':>7}{'x orc':>7}{'replica-s':>10}{'x orc':>7}{'peak':>5}{'x orc':>6}"
        f"{'out s':>7}{'in s':>7}{'turns':>6}{'/300s':>6}{'refused':>8}{'preempt':>8}",
    ]
    for name, x in m.items():
        lines.append(
            f"  {name:<13}{100 * x.good_ratio:>7.1f}{x.good_ratio / max(oracle.good_ratio, 1e-9):>7.3f}"
            f"{x.replica_seconds:>10.0f}{x.replica_seconds / max(oracle.replica_seconds, 1e-9):>7.2f}"
            f"{x.peak:>5}{x.peak / max(1, oracle.peak):>6.2f}{_s(x.scale_out_s):>7}{_s(x.scale_in_s):>7}"
            f"{x.direction_changes:>6}{x.most_changes_in_window:>6}{x.refused:>8}{x.preemptions:>8}"
        )
    for scaler in ("kvgate", "kvgate_forecast"):
        if scaler in m:
            lines.append(f"  {scaler}:")
            lines.extend(f"  {line}" for line in targets(result.scenario, m, scaler))
    return "\n".join(lines)


def present_only_table(result: ScenarioResult, bounds: Sequence[PresentOnly]) -> str:
    """The oracle's schedules followed with no lead, against the oracle of ``result``: where none
    reaches 99 % of its good within 1.25x its replica-seconds, no reactive scaler does."""
    oracle = result.runs["oracle"]
    oracle_good = max(good_ratio(oracle), 1e-9)
    lines = [
        f"  present only (the oracle's schedule, no lead; 99 % of the oracle's good is "
        f"{100 * SLO_OF_ORACLE_RATIO * good_ratio(oracle):.1f} %)",
        f"  {'headroom':<13}{'good %':>7}{'x orc':>7}{'replica-s':>10}{'x orc':>7}{'both':>6}",
    ]
    for bound in bounds:
        good = good_ratio(bound.run)
        cost = bound.run.replica_seconds / max(oracle.replica_seconds, 1e-9)
        both = good >= SLO_OF_ORACLE_RATIO * oracle_good and cost <= COST_OF_ORACLE_RATIO
        lines.append(
            f"  {bound.headroom_ratio:<13.2f}{100 * good:>7.1f}{good / oracle_good:>7.3f}"
            f"{bound.run.replica_seconds:>10.0f}{cost:>7.2f}{'yes' if both else 'no':>6}"
        )
    return "\n".join(lines)


def targets(scenario: str, m: Mapping[str, Measures], scaler: str = "kvgate") -> list[str]:
    """kvgate's policy (``scaler``: without or with its forecast) against each target of the issue:
    one line each, ``ok`` or ``MISS``."""
    k, oracle = m[scaler], m["oracle"]
    out = [
        _verdict(
            k.good_ratio >= SLO_OF_ORACLE_RATIO * oracle.good_ratio,
            f"SLO >= 99 % of the oracle's: {k.good_ratio / max(oracle.good_ratio, 1e-9):.3f}",
        ),
        _verdict(
            k.replica_seconds <= COST_OF_ORACLE_RATIO * oracle.replica_seconds,
            f"replica-s <= 1.25x the oracle's: {k.replica_seconds / max(oracle.replica_seconds, 1e-9):.2f}x",
        ),
        _verdict(
            k.scale_in_s is not None and k.scale_in_s <= SCALE_IN_TARGET_S,
            f"scale-in within 120 s of the fall: {_s(k.scale_in_s)} s",
        ),
        _verdict(
            k.most_changes_in_window <= 1, f"<= 1 direction change per 300 s: {k.most_changes_in_window}"
        ),
    ]
    limit = COST_OF_BASELINE_RATIO.get(scenario)
    for name, b in m.items():
        if name in ("kvgate", "kvgate_forecast", "oracle") or limit is None:
            continue
        ratio = k.replica_seconds / max(b.replica_seconds, 1e-9)
        slo_delta = k.good_ratio - b.good_ratio
        if slo_delta >= SLO_BETTER_RATIO:
            ok, how = True, f"SLO {100 * slo_delta:+.1f} points"
        else:
            ok = slo_delta >= -SLO_TIE_RATIO and ratio <= limit
            how = f"SLO {100 * slo_delta:+.1f} points, replica-s {ratio:.2f}x (<= {limit:g}x)"
        out.append(_verdict(ok, f"vs {name}: {how}"))
    return out


def _verdict(ok: bool, text: str) -> str:
    return f"{'ok  ' if ok else 'MISS'} {text}"
