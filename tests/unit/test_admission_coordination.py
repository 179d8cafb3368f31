"""The coordination gate: who sees the other gateways, and what each fail mode does when one does not."""

from __future__ import annotations

import pytest

from kvgate.admission.coordination_gate import CoordinationGate, CoordinationStatus, FailMode
from kvgate.admission.decision import RefusalReason

LEASE_S = 5.0
NOW_S = 1000.0


@pytest.mark.parametrize(
    ("reachable", "last_sync_s", "sees"),
    [
        (True, NOW_S, True),
        (True, NOW_S - LEASE_S, True),
        (True, NOW_S - LEASE_S - 0.001, False),
        (False, NOW_S, False),
        (True, None, False),
        (False, None, False),
    ],
)
def test_closed_refuses_exactly_while_the_others_are_unseen_and_open_never(
    reachable: bool, last_sync_s: float | None, sees: bool
) -> None:
    closed = CoordinationGate(FailMode.CLOSED, LEASE_S, retry_after_s=0.5)
    opened = CoordinationGate(FailMode.OPEN, LEASE_S, retry_after_s=0.5)
    assert closed.sees_others(NOW_S, reachable, last_sync_s) is sees
    assert closed.may_refuse and not opened.may_refuse
    assert opened.refusal(NOW_S, reachable, last_sync_s) is None
    refusal = closed.refusal(NOW_S, reachable, last_sync_s)
    if sees:
        assert refusal is None
        return
    assert refusal is not None
    assert (refusal.status, refusal.reason) == (503, RefusalReason.COORDINATION_UNAVAILABLE)
    assert refusal.retry_after is not None
    assert (refusal.retry_after.seconds, refusal.retry_after.milliseconds) == (1, 500)


def test_status_reports_up_age_and_whether_it_refuses() -> None:
    closed = CoordinationGate(FailMode.CLOSED, LEASE_S, retry_after_s=0.5)
    opened = CoordinationGate(FailMode.OPEN, LEASE_S, retry_after_s=0.5)
    assert closed.status(NOW_S, True, NOW_S - 1.0) == CoordinationStatus(True, 1.0, False)
    assert closed.status(NOW_S, False, NOW_S - 1.0) == CoordinationStatus(False, 1.0, True)
    assert opened.status(NOW_S, False, NOW_S - 1.0) == CoordinationStatus(False, 1.0, False)
    assert closed.status(NOW_S, False, None) == CoordinationStatus(False, None, True)
