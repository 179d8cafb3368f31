"""``@frozen_value`` classes behave as frozen slotted dataclasses do, except the run-time write guard."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from kvgate.vocabulary.replica import ReplicaLoad
from kvgate.vocabulary.value import frozen_value


@frozen_value
class Pair:
    left: int
    right: str = "r"


@dataclasses.dataclass(frozen=True, slots=True)
class FrozenPair:
    left: int
    right: str = "r"


def test_equal_and_hashable_by_fields_like_a_frozen_dataclass() -> None:
    assert Pair(1) == Pair(1, "r") != Pair(2)
    assert hash(Pair(1)) == hash(Pair(1, "r")) == hash(FrozenPair(1))
    assert {Pair(1): "a"}[Pair(1)] == "a"
    assert repr(Pair(1)) == "Pair(left=1, right='r')"


def test_slotted_and_replaceable() -> None:
    pair = Pair(1)
    assert not hasattr(pair, "__dict__")
    assert dataclasses.replace(pair, right="x") == Pair(1, "x") and pair.right == "r"
    assert hash(ReplicaLoad(1, 2, 3, 4)) == hash(ReplicaLoad(1, 2, 3, 4))


def test_the_type_checker_rejects_assigning_a_field(tmp_path: Path) -> None:
    from mypy import api

    program = tmp_path / "assign.py"
    program.write_text(
        "from kvgate.vocabulary.replica import ReplicaLoad\nReplicaLoad().resident_sequences = 1\n"
    )
    report, _, status = api.run(["--no-incremental", "--follow-imports=silent", str(program)])
    assert status == 1 and 'Property "resident_sequences" defined in "ReplicaLoad" is read-only' in report
