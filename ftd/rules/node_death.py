"""Node death: a node's agent went offline (MQTT Last Will, or a clean stop) while a job ran there,
and did not come back within its grace (``coordinator.offline_grace``: the coordinator emits
``node_offline`` only then, :mod:`ftd.coordinator.intake.offline_grace`; an agent restart is not a death).

=====================================  =============================================================
event                                  actions
=====================================  =============================================================
``node_offline`` with jobs on it       checkpoint_restart of each job (``data.jobs`` from the
                                       coordinator, plus any the view still places there) with
                                       ``exclude = [node]``; its ranks there cannot ack, so the
                                       action escalates and moves on after the save deadline
``node_offline`` with no job           nothing (recorded): an idle node may just be rebooting
=====================================  =============================================================
"""

from __future__ import annotations

from ftd.plugin import ActionRequest, ClusterView, Event, Kind, hookimpl
from ftd.plugin.helpers import jobs_of, restart_jobs

#: The only kinds this rule decides on (the coordinator skips it for the others).
EVENT_KINDS = frozenset({Kind.NODE_OFFLINE})


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest] | None:
    if event.kind != Kind.NODE_OFFLINE:
        return None
    jobs = jobs_of(event, view)
    return restart_jobs(jobs, event, f"node {event.node} went offline", exclude=True) or None
