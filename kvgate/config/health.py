"""The health section: how often each replica is probed and how many answers in a row change its state.

Probes and real answers count alike, so a replica failing under traffic is ejected without waiting
for the next probe; the back-off of an ejected replica is routing's (``routing.ejection_backoff_*``).
"""

from __future__ import annotations

from pydantic import Field

from kvgate.config.base import Frozen


class Health(Frozen):
    path: str = Field(
        default="/health", description="Replica path probed with GET. Default /health. Example: /healthz"
    )
    interval_s: float = Field(
        default=2.0, gt=0, description="Seconds between probes of a replica. Default 2. Example: 5"
    )
    timeout_s: float = Field(
        default=1.0, gt=0, description="Seconds one probe may take. Default 1. Example: 0.5"
    )
    healthy_threshold: int = Field(
        default=1,
        ge=1,
        description=(
            "Consecutive successes (probes or answers) that make a new or ejected replica routable. "
            "Default 1. Example: 2"
        ),
    )
    unhealthy_threshold: int = Field(
        default=2,
        ge=1,
        description=(
            "Consecutive failures (failed probes, connect errors, resets, 5xx) that eject a replica "
            "for a back-off (routing.ejection_backoff_*). Default 2. Example: 3"
        ),
    )
