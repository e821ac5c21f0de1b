"""How long each job's saves take: p50/p95 of (last ack - save directive) per checkpoint level.

What: :class:`SaveTimes` keeps, per job and level (``local``, ``partner``, ``shared``; ``default``
where the save named no level), the durations of the last :data:`KEEP` complete saves, and answers
their p50/p95 (:class:`SaveStats`). Two sources feed it: the checkpoint_restart executor records a
save once every rank acknowledged it (:meth:`SaveTimes.record`), and every verified ``checkpoint``
event of the checkpoint tier (issue #34) records its rank's ``save_s`` at its level
(:meth:`SaveTimes.record_checkpoint`: a step counts once, at its slowest rank, since a save is done
when its last rank is), so a job's own periodic saves build the model before any interruption asks
for one, and the ledger's replay at start-up rebuilds it. The decision against an interruption's
deadline (issue #37, :mod:`ftd.coordinator.decide.deadline`) reads the p95 per level; the API's job
view shows the stats.

Why here: it is state about jobs, like the checkpoint catalogue, read by decide and written by
actions. Bounded (``KEEP`` saves per job and level, :data:`MAX_JOBS` jobs, the least recently
saved dropped first) and in memory only: after a coordinator restart the first saves rebuild it, and
until then the decision uses its documented default assumption (unless the ledger's checkpoint
events rebuilt it).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

#: The level recorded for a save that named none (the trainer's or tier's own choice).
DEFAULT_LEVEL = "default"
#: Saves kept per job and level: enough for a p95 that moves with the job, small enough to forget
#: a job's early (cold-cache) saves.
KEEP = 32
#: Jobs kept; the one saved least recently is forgotten first.
MAX_JOBS = 4096


@dataclass(frozen=True)
class SaveStats:
    """One job's saves at one level: how many are kept, and their p50/p95 in seconds."""

    count: int
    p50_s: float
    p95_s: float

    def as_dict(self) -> dict[str, float | int]:
        return {"count": self.count, "p50_s": round(self.p50_s, 3), "p95_s": round(self.p95_s, 3)}


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values`` by the nearest-rank method: always one of the
    observed values, so a p95 is a save that really took that long. ``values`` must be non-empty."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


class SaveTimes:
    """The save-time model (see the module docstring)."""

    def __init__(self, keep: int = KEEP, max_jobs: int = MAX_JOBS) -> None:
        if keep < 1 or max_jobs < 1:
            raise ValueError("keep and max_jobs must be at least 1")
        self._keep = keep
        self._max_jobs = max_jobs
        # job -> level -> save key -> seconds, oldest first: ("ack", n) for an acknowledged directive,
        # ("step", step) for a checkpoint step (its slowest rank so far)
        self._jobs: OrderedDict[str, dict[str, OrderedDict[tuple[str, int], float]]] = OrderedDict()
        self._acks = 0

    def _saves(self, job: str, level: str | None) -> OrderedDict[tuple[str, int], float]:
        levels = self._jobs.get(job)
        if levels is None:
            levels = self._jobs[job] = {}
            while len(self._jobs) > self._max_jobs:
                self._jobs.popitem(last=False)
        else:
            self._jobs.move_to_end(job)
        return levels.setdefault(level or DEFAULT_LEVEL, OrderedDict())

    def _keep_last(self, saves: OrderedDict[tuple[str, int], float]) -> None:
        while len(saves) > self._keep:
            saves.popitem(last=False)

    def record(self, job: str, level: str | None, seconds: float) -> bool:
        """Record one complete save of ``job`` at ``level`` that took ``seconds``. A duration that is
        not a finite non-negative number is refused (False) and changes nothing."""
        if not job or not math.isfinite(seconds) or seconds < 0:
            return False
        saves = self._saves(job, level)
        self._acks += 1
        saves[("ack", self._acks)] = seconds
        self._keep_last(saves)
        return True

    def record_checkpoint(self, job: str, level: str, step: int, seconds: float) -> bool:
        """Record one rank's save of ``job``'s ``step`` at ``level`` that took ``seconds``: the step
        counts once, as its slowest rank's time. Refused (False, nothing changed) for a duration that
        is not a finite non-negative number, a negative step or an empty job or level."""
        if not job or not level or step < 0 or not math.isfinite(seconds) or seconds < 0:
            return False
        saves = self._saves(job, level)
        key = ("step", step)
        if key in saves:
            saves[key] = max(saves[key], seconds)
        else:
            saves[key] = seconds
            self._keep_last(saves)
        return True

    def stats(self, job: str) -> dict[str, SaveStats]:
        """``job``'s stats per level (empty when it has no recorded save)."""
        out: dict[str, SaveStats] = {}
        for level, kept in self._jobs.get(job, {}).items():
            values = list(kept.values())
            out[level] = SaveStats(len(values), percentile(values, 50), percentile(values, 95))
        return out

    def p95(self, job: str) -> dict[str, float]:
        """``job``'s p95 save time per level, the decision's input."""
        return {level: s.p95_s for level, s in self.stats(job).items()}

    def forget(self, job: str) -> None:
        self._jobs.pop(job, None)
