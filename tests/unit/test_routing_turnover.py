"""Write rates: a decaying average of the new KV blocks sent to each replica, on an injected clock."""

from __future__ import annotations

import math

import pytest

from kvgate.routing.turnover import WriteRates


def test_a_replica_never_written_reads_zero() -> None:
    rates = WriteRates(window_s=10.0)
    rates.add("a", 100, 0.0)
    assert rates.rates(["a", "b"], 0.0) == [10.0, 0.0]


def test_writes_decay_with_the_window_and_add_up() -> None:
    rates = WriteRates(window_s=10.0)
    rates.add("a", 100, 0.0)
    assert rates.rates(["a"], 10.0)[0] == pytest.approx(10.0 / math.e)
    rates.add("a", 50, 10.0)
    assert rates.rates(["a"], 10.0)[0] == pytest.approx(10.0 / math.e + 5.0)


def test_a_write_stamped_earlier_than_the_last_does_not_move_the_clock_back() -> None:
    rates = WriteRates(window_s=10.0)
    rates.add("a", 100, 5.0)
    rates.add("a", 100, 4.0)
    assert rates.rates(["a"], 5.0)[0] == pytest.approx(20.0)
    assert rates.rates(["a"], 15.0)[0] == pytest.approx(20.0 / math.e)


def test_a_forgotten_replica_starts_again_from_zero() -> None:
    rates = WriteRates()
    rates.add("a", 100, 0.0)
    rates.forget("a")
    rates.forget("b")
    assert rates.rates(["a"], 0.0) == [0.0]


def test_the_window_must_be_positive() -> None:
    with pytest.raises(ValueError):
        WriteRates(window_s=0.0)
