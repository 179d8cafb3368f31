"""What a routing decision returns: the replica (or none), why, and how every candidate scored.

The ``reason`` is a short stable label the edge counts in metrics (the decision itself records
nothing): ``prefix_affinity`` or ``least_work`` from the kvgate policy, ``round_robin`` or
``least_request`` from the baselines, and when no replica can take the request the binding filter
(``no_model``, ``unhealthy``, ``not_ready``, ``backoff``, ``no_kv_room``, ``excluded``) or
``no_replica`` for an empty fleet. Candidate scores are kept as columns (one sequence per measure,
the lists the policy computed, handed over uncopied and never changed after) and turned into
per-candidate records only when read, so explaining a decision costs nothing on the hot path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvgate.vocabulary.value import frozen_value


@dataclass(frozen=True, slots=True)
class CandidateScore:
    replica_id: str
    work_tokens: float
    """Its backlog plus the request's prompt tokens its cache does not serve (``placement``)."""
    cached_tokens: float
    backlog_tokens: int
    load_ratio: float
    """Token share plus slot share (``kvgate/routing/load.py``): the tie-break between equal work."""


@frozen_value
class ScoreColumns:
    replica_ids: Sequence[str]
    work_tokens: Sequence[float]
    cached_tokens: Sequence[float]
    backlog_tokens: Sequence[int]
    load_ratios: Sequence[float]


_NO_SCORES = ScoreColumns((), (), (), (), ())


@frozen_value
class RoutingDecision:
    replica_id: str | None
    reason: str
    columns: ScoreColumns = field(default=_NO_SCORES)
    cached_prompt_tokens: int = 0
    """Of the request's prompt, the tokens the chosen replica's cache holds (GPU tier): what its
    reservation expects not to compute."""

    @property
    def scores(self) -> tuple[CandidateScore, ...]:
        """Every scored candidate; empty for the baselines and when no replica passed the filters."""
        c = self.columns
        return tuple(
            CandidateScore(
                replica_id=replica_id,
                work_tokens=c.work_tokens[i],
                cached_tokens=c.cached_tokens[i],
                backlog_tokens=c.backlog_tokens[i],
                load_ratio=c.load_ratios[i],
            )
            for i, replica_id in enumerate(c.replica_ids)
        )

    def score_of(self, replica_id: str) -> CandidateScore | None:
        for score in self.scores:
            if score.replica_id == replica_id:
                return score
        return None
