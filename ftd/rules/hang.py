"""Hangs: a rank stopped beating, or a training log stopped growing.

==============================================  ============================================================
event                                           actions
==============================================  ============================================================
``rank_heartbeat_lost`` or ``log_stale``        collect_diagnostics on the node (py-spy of every rank,
                                                ``nvidia-smi -q``; params ``job``/``rank``), then
                                                checkpoint_restart of the job (``data.job``, else every
                                                job on the node) — the node is not excluded: a hang is
                                                not by itself proof of bad hardware
==============================================  ============================================================

Both requests come from one evaluation; the engine starts them together, and diagnostics are quick
(seconds) while the restart first asks every rank to save — a hung rank never acks, so the
checkpoint_restart escalates after ``save_deadline_s`` and stops the job anyway.
"""

from __future__ import annotations

from ftd.plugin import ActionKind, ActionRequest, ClusterView, Event, Kind, hookimpl
from ftd.plugin.helpers import jobs_of, restart_jobs

#: The only kinds this rule decides on (the coordinator skips it for the others).
EVENT_KINDS = frozenset({Kind.RANK_HEARTBEAT_LOST, Kind.LOG_STALE})

@hookimpl
def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest] | None:
    if event.kind not in (Kind.RANK_HEARTBEAT_LOST, Kind.LOG_STALE):
        return None
    jobs = jobs_of(event, view)
    rank = event.data.get("rank")
    what = "heartbeat lost" if event.kind == Kind.RANK_HEARTBEAT_LOST else "log stale"
    subject = f"rank {rank} " if rank is not None else ""
    if event.kind == Kind.LOG_STALE and event.data.get("path"):
        subject = f"{event.data['path']} "
    reason = f"hang suspected: {subject}{what}"
    params = {
        "jobs": jobs,
        **({"job": jobs[0]} if len(jobs) == 1 else {}),  # the executor dumps that job's ranks only
        **({"rank": rank} if rank is not None else {}),
    }
    diag = ActionRequest(kind=ActionKind.COLLECT_DIAGNOSTICS, target=event.node, reason=reason, params=params)
    return [diag, *restart_jobs(jobs, event, reason, exclude=False)]
