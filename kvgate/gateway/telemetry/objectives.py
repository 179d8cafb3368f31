"""How often the configured latency objectives are met: what SLO burn-rate alerts are computed from.

The admission section names each model's objectives (``ttft_slo_s``, ``itl_slo_s``; a tenant may
have its own TTFT objective). A stream's first token is counted as meeting or missing its TTFT
objective, a finished stream's mean inter-token gap its ITL objective
(``kvgate_objective_requests_total{pool, model, objective, outcome}``), and the objectives
themselves are exported (``kvgate_objective_seconds{model, objective}``), so an alert's burn rate
is the missed share over the error budget whatever the objective, never a fixed threshold. A whole
(non-streamed) answer has no first token and is not counted. Only a gateway binds these
(``GatewayMetrics.bind_objectives``): the series exist where objectives are configured.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from kvgate.config.gateway import GatewayConfig
from kvgate.gateway.telemetry.collectors import Count, Counter

OBJECTIVES = ("ttft", "itl")
OUTCOMES = ("met", "missed")

Objectives = Mapping[str, tuple[float | None, float | None]]
"""Model → (TTFT objective, ITL objective), seconds; None where the model has none."""


def configured_objectives(config: GatewayConfig) -> dict[str, tuple[float | None, float | None]]:
    admission = config.admission
    return {
        m.name: (admission.model_rules(m.name).ttft_slo_s, admission.model_rules(m.name).itl_slo_s)
        for m in config.models
    }


class ObjectiveSeries:
    """The attainment counter's children, found once per (pool, model): met and missed per objective."""

    def __init__(self, registry: CollectorRegistry, objectives: Objectives) -> None:
        self._counter = Counter(
            "kvgate_objective_requests",
            "Streams by whether they met their latency objective: objective ttft (first token "
            "within the model's or tenant's ttft_slo_s) or itl (mean inter-token gap within "
            "itl_slo_s), outcome met or missed. The burn rate of an SLO is the missed share over "
            "its error budget.",
            ["pool", "model", "objective", "outcome"],
            registry,
        )
        registry.register(_ObjectiveGauges(objectives))
        self._children: dict[tuple[str, str], tuple[Count, Count, Count, Count]] = {}

    def count(self, pool: str, model: str, objective: int, met: bool) -> None:
        """``objective``: 0 for TTFT, 1 for ITL."""
        children = self._children.get((pool, model))
        if children is None:
            labels = self._counter.labels
            children = self._children[(pool, model)] = (
                labels(pool, model, "ttft", "met"),
                labels(pool, model, "ttft", "missed"),
                labels(pool, model, "itl", "met"),
                labels(pool, model, "itl", "missed"),
            )
        children[2 * objective + (0 if met else 1)].value += 1


class _ObjectiveGauges(Collector):
    def __init__(self, objectives: Objectives) -> None:
        self._objectives = objectives

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "kvgate_objective_seconds",
            "The configured latency objectives: ttft (admission ttft_slo_s) and itl (itl_slo_s) per "
            "model, in seconds; what kvgate_objective_requests_total counts against.",
            labels=["model", "objective"],
        )
        for model, values in sorted(self._objectives.items()):
            for name, seconds in zip(OBJECTIVES, values, strict=True):
                if seconds is not None:
                    family.add_metric([model, name], seconds)
        return [family]
