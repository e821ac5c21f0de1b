"""Rank supervisors (``ftd run``, issue #24): a job's supervisor on a node was lost (its connection to
the agent closed without a goodbye: killed, crashed) or failed (it could not start its ranks: a
preflight that failed, a command that would not start).

=========================================  ========================================================
event                                      actions
=========================================  ========================================================
``supervisor`` lost/failed, role active,   checkpoint_restart of the job with ``avoid = [node]``:
on a node the job trains on                its slot goes to a hot spare in a new generation (or
                                           the job is requeued through the scheduler when none is
                                           left); the node is *not* drained: a supervisor is
                                           software, nothing says the hardware is bad
``supervisor`` lost/failed, role spare     notify: the job has one spare fewer (never a restart:
or out                                     a spare is not a node the job trains on)
a job no longer on the node                nothing (recorded)
=========================================  ========================================================

A lost supervisor during a restart ftd is already running for the job is that action's business
(its restart phase sees the slot fail and takes the next spare); the request here is then a
duplicate the policy gate folds into it.
"""

from __future__ import annotations

from ftd.plugin import ActionKind, ActionRequest, ClusterView, Event, Kind, hookimpl
from ftd.plugin.helpers import notify

#: The only kinds this rule decides on (the coordinator skips it for the others).
EVENT_KINDS = frozenset({Kind.SUPERVISOR})
BAD_STATES = frozenset({"lost", "failed"})


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest] | None:
    if event.kind != Kind.SUPERVISOR:
        return None
    data = event.data
    job, state, role = data.get("job"), data.get("state"), data.get("role")
    if not isinstance(job, str) or not job or state not in BAD_STATES:
        return None
    why = f"job {job}'s rank supervisor is {state}"
    if isinstance(data.get("reason"), str) and data["reason"]:
        why += f" ({data['reason']})"
    if role == "active" and event.node in view.job_nodes(job):
        return [
            ActionRequest(
                kind=ActionKind.CHECKPOINT_RESTART,
                target=job,
                reason=f"{why} on {event.node}: its slot goes to a spare",
                params={"severity": str(event.severity), "node": event.node, "avoid": [event.node]},
            )
        ]
    if role in ("spare", "out"):
        return [
            notify(event, f"{why} on {event.node} (a {role} node): the job has one spare fewer", {"job": job})
        ]
    return None
