"""What a tenant may spend: its share of contended capacity, its budgets, its priority class.

Budgets: tokens per minute (prompt + max output), requests per minute and requests at once.

A tenant is named here and identified elsewhere: which bearer keys are which tenant is the auth
section's (``kvgate.config.auth.TenantKeys``), so credentials and what they buy are reviewed and
rotated apart. Priority classes order the queue strictly; weights share what is contended within
a class, in tokens.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from kvgate.config.base import Frozen


class PriorityClass(StrEnum):
    """Queue order across classes is strict: every ``critical`` request before any ``standard``."""

    CRITICAL = "critical"
    STANDARD = "standard"
    SHEDDABLE = "sheddable"

    @property
    def rank(self) -> int:
        return _PRIORITY_RANK[self]


_PRIORITY_RANK = {PriorityClass.CRITICAL: 0, PriorityClass.STANDARD: 1, PriorityClass.SHEDDABLE: 2}


class TenantConfig(Frozen):
    """What a tenant may spend; which keys are the tenant is auth's (``kvgate.config.auth``)."""

    name: str = Field(
        min_length=1,
        description="Tenant name, as an auth.tenants entry names it (text). No default. "
        "Example: 'search-team'.",
    )
    weight: float = Field(
        default=1.0,
        gt=0,
        description=(
            "Share of contended capacity, relative to other tenants, counted in tokens (ratio). "
            "Default 1.0. Example: 3.0 (three times the tokens of a weight-1 tenant)."
        ),
    )
    tokens_per_min: int | None = Field(
        default=None,
        gt=0,
        description=(
            "Budget of prompt + max output tokens per minute (tokens/min); none = unlimited. "
            "Default none. Example: 200000."
        ),
    )
    requests_per_min: int | None = Field(
        default=None,
        gt=0,
        description=(
            "Requests this tenant may send per minute, on every served route, whatever they cost "
            "(requests/min); none = unlimited. Default none. Example: 600."
        ),
    )
    max_concurrent_requests: int | None = Field(
        default=None,
        gt=0,
        description=(
            "Requests of this tenant the gateway holds at once, queued or served (requests); none = "
            "unlimited. Default none. Example: 32."
        ),
    )
    priority: PriorityClass = Field(
        default=PriorityClass.STANDARD,
        description="Priority class of this tenant's requests (enum). Default 'standard'. "
        "Example: 'critical'.",
    )
    ttft_slo_s: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Time-to-first-token objective of this tenant's requests, in place of their model's "
            "ttft_slo_s whatever the model (seconds): an interactive tenant may be refused sooner "
            "than the model's objective would, a batch tenant may wait longer. Default none (the "
            "model's). Example: 0.5."
        ),
    )
