"""What the policy answers for a pool, and the bounded set of reasons it gives (a metric label)."""

from __future__ import annotations

from dataclasses import dataclass

SCALE_OUT_OCCUPANCY_TTFT = "scale_out_occupancy_ttft"
SCALE_OUT_BACKLOG_TTFT = "scale_out_backlog_ttft"
SCALE_OUT_OCCUPANCY_ITL = "scale_out_occupancy_itl"
SCALE_OUT_QUEUE_WAIT = "scale_out_queue_wait"
SCALE_OUT_TOKEN_RATE = "scale_out_token_rate"
SCALE_OUT_SEQUENCES = "scale_out_sequences"
SCALE_OUT_KV = "scale_out_kv"
SCALE_OUT_FORECAST = "scale_out_forecast"
SCALE_OUT_SCHEDULE = "scale_out_schedule"
SCALE_IN_IDLE = "scale_in_idle"
SCALE_IN_TOKEN_RATE = "scale_in_token_rate"
HOLD = "hold"
HOLD_COLD_START = "hold_cold_start"
HOLD_STABILIZING = "hold_stabilizing"
MIN_REPLICAS = "min_replicas"
MAX_REPLICAS = "max_replicas"
REASONS = (
    SCALE_OUT_OCCUPANCY_TTFT,
    SCALE_OUT_BACKLOG_TTFT,
    SCALE_OUT_OCCUPANCY_ITL,
    SCALE_OUT_QUEUE_WAIT,
    SCALE_OUT_TOKEN_RATE,
    SCALE_OUT_SEQUENCES,
    SCALE_OUT_KV,
    SCALE_OUT_FORECAST,
    SCALE_OUT_SCHEDULE,
    SCALE_IN_IDLE,
    SCALE_IN_TOKEN_RATE,
    HOLD,
    HOLD_COLD_START,
    HOLD_STABILIZING,
    MIN_REPLICAS,
    MAX_REPLICAS,
)


@dataclass(frozen=True, slots=True)
class Recommendation:
    pool: str
    desired_replicas: int
    reason: str
    """One of ``REASONS``: bounded, so it can be a metric label."""
    detail: str = ""
    """The numbers behind the decision, for logs and humans."""
    forecast_replicas: float | None = None
    """Demand the forecast expects over the lead, in replicas (None: forecast off or no history)."""
    forecast_error_replicas: float | None = None
    """The latest forecast whose lead has passed minus the most demand that came over it, in replicas."""


def seconds_text(value_s: float | None) -> str:
    """A latency as a recommendation's detail shows it."""
    return "none" if value_s is None else f"{value_s:.3f}s"
