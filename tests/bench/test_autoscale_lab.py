"""Autoscaling in closed loop on the simulator's engines: deterministic, and the oracle is a floor.

``python -m bench autoscale_lab`` plays a seeded trace through a fleet of the simulator's
``Engine``s behind kvgate's router and queue, resized every 15 s by a scaler, on one virtual clock,
so every number is a function of the trace, the seed and the scaler. The ``small`` scenario is a 4x
burst of a mix of chats, documents and generations over 4.5 minutes. Assertions compare scalers with
each other and with the oracle, never with wall-clock time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.autoscale_lab.__main__ import main
from bench.autoscale_lab.compare import ScenarioResult, good_ratio, present_only, run_scenario
from bench.autoscale_lab.measures import scenario_measures
from bench.autoscale_lab.oracle import WINDOW_S
from bench.autoscale_lab.records import LabRun, Outcome, Tick
from bench.autoscale_lab.scenarios import LAB_DAY_S, SCENARIOS


@pytest.fixture(scope="module")
def result() -> ScenarioResult:
    return run_scenario("small", seed=1, policies=("kvgate", "request_rate", "utilization", "waiting"))


def test_the_same_seed_gives_the_same_run(result: ScenarioResult) -> None:
    again = run_scenario("small", seed=1, policies=("kvgate",), oracle_headroom=result.oracle.headroom_ratio)
    first, second = result.runs["kvgate"], again.runs["kvgate"]
    assert first.ticks == second.ticks
    assert first.replica_seconds == second.replica_seconds
    assert [o.first_token_s for o in first.outcomes] == [o.first_token_s for o in second.outcomes]
    assert again.oracle.schedule == result.oracle.schedule
    assert again.runs["oracle"].ticks == result.runs["oracle"].ticks


def test_every_request_is_served_whole_or_refused(result: ScenarioResult) -> None:
    for run in result.runs.values():
        assert all(o.refused or o.tokens == o.arrival.output_tokens for o in run.outcomes)


def test_the_oracle_meets_the_slo_with_no_more_replica_seconds_than_any_scaler_meeting_it(
    result: ScenarioResult,
) -> None:
    oracle = result.runs["oracle"]
    assert good_ratio(oracle) >= 0.99
    for name, run in result.runs.items():
        if good_ratio(run) >= good_ratio(oracle):
            assert oracle.replica_seconds <= run.replica_seconds, name


def test_kvgate_scales_out_within_a_cold_start_of_the_burst_where_request_rate_never_moves(
    result: ScenarioResult,
) -> None:
    """4 req/s of chats, documents and generations is below one replica's request-rate target
    but several replicas' worth of tokens."""
    measures = scenario_measures(result)
    kvgate, rate = measures["kvgate"], measures["request_rate"]
    assert kvgate.scale_out_s is not None and kvgate.scale_out_s <= 60
    assert rate.scale_out_s is None
    assert kvgate.good_ratio >= rate.good_ratio


def test_the_oracles_schedule_asked_for_without_its_lead_meets_less_of_the_slo(
    result: ScenarioResult,
) -> None:
    """The bound of a scaler without foresight: the same schedule, asked for as each window begins,
    leaves the burst's first cold start to the replicas already there."""
    (bound,) = present_only("small", [result.oracle.headroom_ratio], seed=1)
    oracle = result.runs["oracle"]
    assert [t.desired for t in bound.run.ticks] == [
        result.oracle.schedule[min(len(result.oracle.schedule) - 1, int(t.time_s // WINDOW_S))]
        for t in bound.run.ticks
    ]
    assert good_ratio(bound.run) < good_ratio(oracle)
    assert bound.run.replica_seconds <= oracle.replica_seconds


def test_the_command_line_prints_the_table_against_the_oracle_and_plots_into_out(tmp_path: Path) -> None:
    assert main(["--scenario", "small", "--policies", "request_rate", "--out", str(tmp_path)]) == 0
    printed = (tmp_path / "output.txt").read_text().splitlines()
    rows = [line.split()[0] for line in printed if line.startswith(("  oracle ", "  request_rate "))]
    assert rows == ["oracle", "request_rate"]
    assert (tmp_path / "autoscale-lab-small.png").stat().st_size > 0


def test_a_week_repeats_its_day_and_the_broken_one_moves_its_burst() -> None:
    week, moved = SCENARIOS["burst_week"], SCENARIOS["burst_moved"]
    day_s = LAB_DAY_S
    assert week.day_s == day_s and week.history_s == day_s
    for t in (0.0, 130.0, 310.0, 590.0):
        assert week.rate_rps(t) == week.rate_rps(t + 4 * day_s)
    assert moved.rate_rps(2 * day_s + 130.0) == 16.0 and moved.rate_rps(3 * day_s + 130.0) == 4.0
    assert moved.rate_rps(3 * day_s + 370.0) == 16.0


def test_a_run_since_its_history_counts_what_came_after() -> None:
    arrivals = SCENARIOS["small"].arrivals(0)[:4]
    outcomes = tuple(Outcome(a) for a in arrivals)
    cut_s = arrivals[2].arrival_s
    ticks = (Tick(0.0, 1, 1, 1), Tick(cut_s, 2, 2, 1))
    run = LabRun("x", outcomes, ticks, 30.0, 0, ((0.0, 20.0), (5.0, 15.0)))
    later = run.since(cut_s)
    assert [o.arrival for o in later.outcomes] == arrivals[2:]
    assert later.ticks == (Tick(cut_s, 2, 2, 1),)
    assert later.replica_seconds == max(0.0, 20.0 - cut_s) + max(0.0, 15.0 - max(5.0, cut_s))
    assert run.since(0.0) is run
