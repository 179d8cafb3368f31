"""The autoscaling policy inside the gateway, on the gateway's own signals.

It publishes each pool's desired replicas (with the reason) as ``kvgate_autoscaler_desired_replicas``
for KEDA or an HPA to act on; ``kvgate autoscale`` runs the same policy in a process of its own,
across several gateways (``kvgate.autoscaler.loop``).
"""

from __future__ import annotations

import asyncio
import time

from kvgate.autoscaler.policy import Autoscaler
from kvgate.autoscaler.recommendation import Recommendation
from kvgate.autoscaler.signals import pool_signals
from kvgate.config.autoscaler import AutoscalerConfig
from kvgate.gateway.telemetry.metrics import GatewayMetrics
from kvgate.vocabulary.clock import Clock


class GatewayRecommender:
    """The policy inside the gateway: publishes desired replicas per pool on its own metrics."""

    def __init__(
        self, metrics: GatewayMetrics, config: AutoscalerConfig, clock: Clock = time.monotonic
    ) -> None:
        self._metrics = metrics
        self._config = config
        self._clock = clock
        self._autoscaler = Autoscaler(config)

    def recommend(self) -> list[Recommendation]:
        recommendations = self._autoscaler.update(pool_signals(self._metrics.signals_doc(), self._clock()))
        for rec in recommendations:
            self._metrics.set_desired_replicas(
                rec.pool, rec.desired_replicas, rec.reason, rec.forecast_replicas, rec.forecast_error_replicas
            )
        return recommendations

    async def run(self) -> None:
        while True:
            self.recommend()
            await asyncio.sleep(self._config.interval_s)
