"""How long a request may wait in the queue: the queue's limit, its client's timeout, its model's
time-to-first-token objective.

A client that will give up after ``t`` seconds gains nothing from waiting in our queue for longer,
so its timeout (read from the request headers the config names) bounds the queue-wait budget; so
does the TTFT objective (its tenant's when the tenant has one, otherwise its model's), less the
request's own prefill at the measured rate, since a request that waits past it is served too late
to count. The first configured header present with a positive
finite number wins; anything else is ignored rather than rejected, since the header is advisory.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import Enum

from kvgate.admission.decision import AdmissionRequest, RefusalReason
from kvgate.config.admission import AdmissionConfig


class WaitBound(Enum):
    """What limits how long a request may wait: the reason it is refused when its expected wait
    is longer."""

    QUEUE_LIMIT = RefusalReason.KV_CAPACITY
    CLIENT_TIMEOUT = RefusalReason.DEADLINE
    TTFT_SLO = RefusalReason.TTFT_SLO


def wait_budget(
    request: AdmissionRequest, config: AdmissionConfig, prefill_tokens_per_s: float
) -> tuple[float, WaitBound]:
    """How long ``request`` may wait in the queue, and what bounds it: the queue's limit, the
    client's own timeout, or the TTFT objective (the tenant's, else the model's) less the request's
    own prefill."""
    budget_s, bound = config.max_queue_wait_s, WaitBound.QUEUE_LIMIT
    timeout_s = request.client_timeout_s
    if timeout_s is not None and timeout_s < budget_s:
        budget_s, bound = timeout_s, WaitBound.CLIENT_TIMEOUT
    slo_s = ttft_objective_s(request, config)
    if slo_s is not None:
        slo_budget_s = slo_s - request.cost.prompt_tokens / prefill_tokens_per_s
        if slo_budget_s < budget_s:
            budget_s, bound = max(0.0, slo_budget_s), WaitBound.TTFT_SLO
    return budget_s, bound


def ttft_objective_s(request: AdmissionRequest, config: AdmissionConfig) -> float | None:
    """The request's time-to-first-token objective: its tenant's, else its model's, else none."""
    slo_s = request.tenant.ttft_slo_s
    return config.model_rules(request.model).ttft_slo_s if slo_s is None else slo_s


def client_timeout_s(headers: Mapping[str, str], config: AdmissionConfig) -> float | None:
    """Seconds the client will wait, from the first usable deadline header; None when absent.

    ``headers`` must have lower-case names (as ASGI delivers them).
    """
    for header in config.deadline_headers:
        raw = headers.get(header.name)
        if raw is None:
            continue
        try:
            value = float(raw)
        except ValueError:
            continue
        if not math.isfinite(value) or value <= 0:
            continue
        return value / 1000.0 if header.unit == "ms" else value
    return None
