"""The one ``/metrics`` reader: sums and maxima by name over every series, labels as Prometheus
reads them, a page cut to the wanted names first, a missing metric visible as such."""

from __future__ import annotations

import math

from bench.harness.metrics import Page, parse

PAGE = """\
# HELP vllm:num_preemptions_total Cumulative preemptions.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 3.0
vllm:num_preemptions_total{engine="1",model_name="m"} 4.0
# TYPE kvgate_pool_kv_occupancy_ratio gauge
kvgate_pool_kv_occupancy_ratio{pool="a",source="estimate"} 0.25
kvgate_pool_kv_occupancy_ratio{pool="a",source="scraped"} 0.5
kvgate_pool_kv_occupancy_ratio{pool="b \\"quoted\\", with space",source="estimate"} 0.125
# TYPE kvgate_sim_lag_ratio gauge
kvgate_sim_lag_ratio 0.01
kvgate_sim_lag_ratio{replica="1"} 0.07
"""


def test_a_counter_is_summed_over_its_series_by_its_written_name() -> None:
    assert parse(PAGE).sum("vllm:num_preemptions_total") == 7.0


def test_labels_select_series_and_read_as_prometheus_reads_them() -> None:
    page = parse(PAGE)
    assert page.sum("kvgate_pool_kv_occupancy_ratio", {"source": "estimate"}) == 0.375
    assert page.values("kvgate_pool_kv_occupancy_ratio", {"pool": 'b "quoted", with space'}) == [0.125]


def test_max_and_a_missing_metric() -> None:
    page = parse(PAGE)
    assert page.max("kvgate_sim_lag_ratio") == 0.07
    assert page.sum("kvgate_resident_sequences") == 0.0
    assert math.isnan(page.sum("kvgate_resident_sequences", missing=math.nan))


def test_a_page_cut_to_the_wanted_names_reads_the_same_for_them() -> None:
    cut = parse(PAGE, only=("vllm:num_preemptions_total",))
    assert cut.sum("vllm:num_preemptions_total") == 7.0
    assert {sample.name for sample in cut.samples} == {"vllm:num_preemptions_total"}


def test_pages_of_a_fleet_add_up() -> None:
    one = parse(PAGE)
    assert Page(one.samples + one.samples).sum("vllm:num_preemptions_total") == 14.0
