"""How many sequences a replica may run while its inter-token latency meets the model's objective.

A replica decodes all its resident sequences in each engine step, so its step time, which is every
stream's inter-token latency (ITL), grows with the sequences it runs; how fast depends on the
model, the hardware and the contexts, which a static ``max_active_sequences_per_replica`` can only
guess. ``ItlGuard`` learns the line ``ITL = a + b * sequences`` per replica from finished streams
(a stream's mean inter-token gap against the sequences resident on the replica while it ran) and
answers the most sequences whose predicted ITL stays within the tightest ``itl_slo_s`` of the
models the replica serves.

The fit is an exponentially weighted least squares (recent streams count most, so the line follows
a replica whose contexts or warmth change), with one difference: the slope moves towards what the
recent streams say only as far as their spread in sequences can tell it. A replica held at its
limit runs the same number of sequences stream after stream; plain forgetting would then lose the
slope, predict a flat line and open the replica to everything, and the next burst would learn the
slope again the hard way. Here the slope it learned stays until streams at other loads move it,
while the intercept follows the level of the latest ones.

Bounds keep a few streams from deciding much: the limit stays at the ceiling (the static guard)
until ``MIN_OBSERVATIONS`` streams were seen on the replica; from then on a stream counts as at
most ``OUTLIER_RATIO`` times off the line (a steeper truth is still reached, a few streams later);
a slope below zero (latency does not fall with load; it is noise) counts as flat; a replica over
its objective sheds load in proportion (its recent load times objective over recent latency),
never all at once, however little the line knows yet; and the limit never drops below the floor
(``itl_guard_min_sequences``), so a replica whose latency misses the objective even when nearly
idle still serves, as slowly as it must, and keeps producing the streams that would show it
recovered. Each observation costs O(1): five running sums and a few divisions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kvgate.config.admission import AdmissionConfig
from kvgate.vocabulary.replica import ReplicaView

DECAY_WEIGHT = 0.05
"""Share of the fit's weight each new stream takes (the others' decays by ``1 - DECAY_WEIGHT``):
about the last twenty streams on a replica decide its line."""
MIN_OBSERVATIONS = 8
"""Streams a replica must have finished before its learned limit applies."""
OUTLIER_RATIO = 2.0
"""Once the fit stands, a stream counts as at most this many times slower (or faster) than the line
predicts: one stream stalled behind a long prefill or a paused replica says little about load."""
SLOPE_PRIOR_WEIGHT = 64.0
"""How firmly the slope stays where it was (streams x sequences squared): as firmly as four streams
spread four sequences either side of their mean move it."""


@dataclass(slots=True)
class ItlFit:
    """The weighted sums of one replica's streams and the line fitted to them (ITL in seconds)."""

    weight: float = 0.0
    sum_sequences: float = 0.0
    sum_itl_s: float = 0.0
    sum_sequences_sq: float = 0.0
    sum_sequences_itl_s: float = 0.0
    intercept_s: float = 0.0
    slope_s: float = 0.0
    """Seconds each further resident sequence adds to every stream's inter-token gap; never below 0."""
    observations: int = 0

    def observe(self, sequences: float, itl_s: float) -> None:
        """A stream that ran alongside ``sequences`` resident sequences (itself included, on
        average over its life) had a mean inter-token gap of ``itl_s``."""
        if self.observations >= MIN_OBSERVATIONS:
            predicted_s = self.predicted_itl_s(sequences)
            if predicted_s > 0.0:
                itl_s = min(max(itl_s, predicted_s / OUTLIER_RATIO), predicted_s * OUTLIER_RATIO)
        keep = 1.0 - DECAY_WEIGHT
        self.weight = self.weight * keep + 1.0
        self.sum_sequences = self.sum_sequences * keep + sequences
        self.sum_itl_s = self.sum_itl_s * keep + itl_s
        self.sum_sequences_sq = self.sum_sequences_sq * keep + sequences * sequences
        self.sum_sequences_itl_s = self.sum_sequences_itl_s * keep + sequences * itl_s
        self.observations += 1
        mean_sequences = self.sum_sequences / self.weight
        mean_itl_s = self.sum_itl_s / self.weight
        spread = max(0.0, self.sum_sequences_sq - self.weight * mean_sequences * mean_sequences)
        covariance = self.sum_sequences_itl_s - self.weight * mean_sequences * mean_itl_s
        slope_s = (covariance + SLOPE_PRIOR_WEIGHT * self.slope_s) / (spread + SLOPE_PRIOR_WEIGHT)
        self.slope_s = max(0.0, slope_s)
        self.intercept_s = mean_itl_s - self.slope_s * mean_sequences

    def predicted_itl_s(self, sequences: float) -> float:
        return self.intercept_s + self.slope_s * sequences

    def limit(self, objective_s: float, floor: int, ceiling: int) -> int:
        """The most sequences whose predicted ITL is within ``objective_s``, in ``[floor, ceiling]``;
        ``ceiling`` until ``MIN_OBSERVATIONS`` streams were seen. Never below the recent load scaled
        by objective over recent latency (``shed_limit``): a replica over its objective sheds load
        in that proportion, not all at once."""
        if self.observations < MIN_OBSERVATIONS:
            return ceiling
        headroom_s = objective_s - self.intercept_s
        if headroom_s <= 0.0:
            by_line = 0
        elif self.slope_s * ceiling <= headroom_s:
            return ceiling
        else:
            by_line = math.floor(headroom_s / self.slope_s)
        return max(floor, min(ceiling, max(by_line, self.shed_limit(objective_s))))

    def shed_limit(self, objective_s: float) -> int:
        """The recent mean load times objective over the recent mean latency, when that latency is
        over the objective (0 otherwise: nothing to shed). As if latency were proportional to load:
        where the line has an intercept this stays above the line's limit and below the load, so
        repeated, it steps down onto the line's limit from above; and it holds while the line is
        still unsure, where a flat line with a high intercept would say the floor."""
        mean_itl_s = self.sum_itl_s / self.weight
        if mean_itl_s <= objective_s:
            return 0
        return math.floor(self.sum_sequences / self.weight * objective_s / mean_itl_s)


@dataclass(slots=True)
class ItlGuard:
    """Per replica, the learned fit and the sequence limit it gives (``limits``, read on every
    admission decision, so it is kept up to date by ``observe`` rather than computed per read)."""

    objectives_s: Mapping[str, float | None]
    """The ITL objective of each model named in ``admission.models`` (seconds; None: it has none)."""
    default_objective_s: float | None
    """The objective of models not named in ``objectives_s`` (``admission.default_model``)."""
    floor: int
    ceiling: int
    fits: dict[str, ItlFit] = field(default_factory=dict)
    limits: dict[str, int] = field(default_factory=dict)
    """The learned limit per replica; a replica not in it has none (the static guard applies)."""

    @classmethod
    def from_config(cls, config: AdmissionConfig) -> ItlGuard | None:
        """The guard, or None when no model has an ITL objective (nothing to learn or enforce)."""
        objectives_s = {model: rules.itl_slo_s for model, rules in config.models.items()}
        default_s = config.default_model.itl_slo_s
        if default_s is None and all(objective is None for objective in objectives_s.values()):
            return None
        return cls(
            objectives_s,
            default_s,
            config.itl_guard_min_sequences,
            config.max_active_sequences_per_replica,
        )

    def objective_s(self, models: Iterable[str]) -> float | None:
        """The tightest objective among ``models``: one batch decodes them all, so every stream on
        the replica sees the same step time."""
        tightest: float | None = None
        for model in models:
            objective = self.objectives_s.get(model, self.default_objective_s)
            if objective is not None and (tightest is None or objective < tightest):
                tightest = objective
        return tightest

    def observe(self, replica_id: str, models: Iterable[str], sequences: float, itl_s: float) -> None:
        """A stream finished on ``replica_id`` (serving ``models``): refit its line and limit.
        Replicas serving no model with an objective are not tracked."""
        objective = self.objective_s(models)
        if objective is None:
            return
        fit = self.fits.get(replica_id)
        if fit is None:
            fit = self.fits[replica_id] = ItlFit()
        fit.observe(sequences, itl_s)
        self.limits[replica_id] = fit.limit(objective, self.floor, self.ceiling)

    def forget(self, replica_id: str) -> None:
        """The replica left the fleet: a replica coming back under its name starts afresh."""
        self.fits.pop(replica_id, None)
        self.limits.pop(replica_id, None)


def sequence_limit(limit: int, guard: ItlGuard | None, replica_id: str) -> int:
    """A replica's guard: ``limit`` (``max_active_sequences_per_replica``), or the limit learned
    against the ITL objective when lower."""
    if guard is not None:
        learned = guard.limits.get(replica_id, limit)
        if learned < limit:
            return learned
    return limit


def active_limit(limit: int, guard: ItlGuard | None, view: ReplicaView) -> int:
    """The sequences admission lets ``view`` run: its guard, or its own slots when fewer. Runs for
    every replica of every room check, so ``sequence_limit`` is written out."""
    if guard is not None:
        learned = guard.limits.get(view.replica_id, limit)
        if learned < limit:
            limit = learned
    return view.max_sequences if 0 < view.max_sequences < limit else limit


def measured_itl_s(guard: ItlGuard | None, view: ReplicaView) -> float | None:
    """The replica's inter-token latency at the sequences it runs now, from its learned line, once
    that line stands; None before (the fleet's applies)."""
    fit = None if guard is None else guard.fits.get(view.replica_id)
    if fit is None or fit.observations < MIN_OBSERVATIONS:
        return None
    return fit.predicted_itl_s(view.load.resident_sequences)
