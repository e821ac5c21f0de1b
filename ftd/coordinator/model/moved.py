"""The jobs ftd moved through the scheduler and that do not train again yet (issue #32 item 5).

What: :class:`MovedJobs` keeps, per job ftd requeued (a ``checkpoint_restart`` whose detail says
``requeued``), when it was requeued, the nodes it excludes, the action that moved it and what the
scheduler last said of it (PENDING and why). The API's ``/v1/jobs`` shows such a job as ``pending
after requeue, excluding NODE(S)`` (:func:`ftd.coordinator.api.views.jobs_out`), ``ftd status`` and
the dashboard with it. A job leaves the book when it trains again (a rank registers, or its Prolog
reports an allocation started after the requeue: :meth:`ClusterState.apply_presence`), when the
scheduler says it runs or ended, or when the scheduler no longer knows it (the reconciler's rounds,
:mod:`ftd.coordinator.upkeep.reconcile`).

Why: between the end of the restart's action and the job's next start the job has no rank and no
allocation anywhere, so the cluster state forgot it: the job ftd had just moved vanished from every
view while it waited in the queue, and the only trace was the ``job_pending`` alert minutes later.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field


@dataclass
class MovedJob:
    job: str
    since: float  # when ftd requeued it (wall clock)
    excluding: list[str]  # the nodes the requeue excluded ([]: requeued in place)
    action: str  # the checkpoint_restart that moved it
    scheduler_state: str = ""  # what the scheduler last said ("" until the reconciler asked)
    scheduler_reason: str = ""  # why it is pending, as the scheduler says (Slurm's Reason)

    def why(self) -> str:
        """One sentence: ``pending after requeue, excluding node-3 (action ..., since ...)``."""
        excluding = f", excluding {', '.join(self.excluding)}" if self.excluding else " in place"
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        said = ""
        if self.scheduler_state:
            reason = self.scheduler_reason
            said = f"; the scheduler says {self.scheduler_state}"
            said += f" ({reason})" if reason and reason not in ("None", "(null)") else ""
        return f"pending after requeue{excluding} (action {self.action}, since {when}{said})"


@dataclass
class MovedJobs:
    jobs: dict[str, MovedJob] = field(default_factory=dict)

    def note(self, job: str, since: float, excluding: Iterable[str], action: str) -> None:
        """ftd requeued ``job`` at ``since`` (an older requeue than the one kept is ignored)."""
        known = self.jobs.get(job)
        if known is not None and known.since > since:
            return
        self.jobs[job] = MovedJob(job, since, sorted({str(n) for n in excluding}), action)

    def scheduler_says(self, job: str, state: str, reason: str) -> None:
        known = self.jobs.get(job)
        if known is not None:
            known.scheduler_state, known.scheduler_reason = state, reason

    def trains_again(self, job: str, started: float | None = None) -> None:
        """``job`` runs again (``started``: when, if known; a start before the requeue is an old one)."""
        known = self.jobs.get(job)
        if known is not None and (started is None or started >= known.since):
            del self.jobs[job]

    def get(self, job: str) -> MovedJob | None:
        return self.jobs.get(job)

    def __iter__(self) -> Iterator[MovedJob]:
        return iter(list(self.jobs.values()))
