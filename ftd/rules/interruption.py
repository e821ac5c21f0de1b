"""Interruptions (issue #37): save and stop the concerned jobs before the announced deadline.

==========================================================  ===============================================
event                                                       actions
==========================================================  ===============================================
``interruption`` (any source: Slurm maintenance or          checkpoint_restart of ``data.job``, or of every
preemption, a cloud notice, an operator's announcement)     job on the node, ``params.deadline`` = the
with a deadline that can be real                            deadline + notify. The executor decides there
                                                            full / fast / none against the real time left
``interruption`` with the same ``data.ref`` (same node)     nothing: one interruption, one action
as an earlier one
``interruption`` whose deadline is not a number, already    notify (error) saying why; no job is touched
past at the notice, or more than 30 days ahead
==========================================================  ===============================================

The job is not moved off the node (``exclude`` empty): the interruption ends the work, not the node's
health; the requeue waits for the scheduler (a maintenance reservation keeps the node out itself).
The decision (full save, node-local save, or no save) is made by the checkpoint_restart executor
with the job's recorded save times when it runs (:mod:`ftd.coordinator.decide.deadline`); the rule
only checks the deadline is sane (:func:`ftd.plugin.deadline.check_deadline`, "now" being the
event's time: a rule has no clock).
"""

from __future__ import annotations

from ftd.plugin import ActionRequest, ClusterView, Event, Kind, hookimpl
from ftd.plugin.deadline import BadDeadline, check_deadline
from ftd.plugin.helpers import jobs_of, notify, restart_jobs

#: The only kind this rule decides on.
EVENT_KINDS = frozenset({Kind.INTERRUPTION})


def _seen_before(event: Event, view: ClusterView, ref: str) -> bool:
    """An earlier interruption of the node with the same source ref (the same notice seen again)."""
    return any(
        record.kind == Kind.INTERRUPTION and record.data.get("ref") == ref and record.ts <= event.ts
        for record in view.node_events(event.node)
    )


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest] | None:
    if event.kind != Kind.INTERRUPTION:
        return None
    data = event.data
    source = str(data.get("source") or "unknown")
    ref = data.get("ref")
    if isinstance(ref, str) and ref and _seen_before(event, view, ref):
        return None
    deadline = data.get("deadline")
    try:
        left = check_deadline(event.ts, deadline)
    except BadDeadline as err:
        why = f"interruption from {source} refused: {err.reason}; no job touched"
        return [notify(event, why, {"refused": err.reason, "source": source, "ref": ref or ""})]
    detail = str(data.get("detail") or "")
    reason = f"interruption ({source}{': ' + detail if detail else ''}) in {left:.0f}s"
    params = {"deadline": float(data["deadline"]), "source": source, "ref": ref or "", "interruption": True}
    restarts = restart_jobs(jobs_of(event, view), event, reason, exclude=False, params=params)
    return [*restarts, notify(event, reason, params)] if restarts else None
