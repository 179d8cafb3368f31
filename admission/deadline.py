"""The client's own timeout, read from the request headers the config names.

A client that will give up after ``t`` seconds gains nothing from waiting in our queue for longer,
so its timeout bounds the queue-wait budget. The first configured header present with a positive
finite number wins; anything else is ignored rather than rejected, since the header is advisory.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from config.admission import AdmissionConfig


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
