"""Kernel events that are not Xids: PCIe AER, the OOM killer, hung tasks.

=================================================  ===========================================================
event                                              actions
=================================================  ===========================================================
``pcie_aer`` fatal (severity critical: an          checkpoint_restart of the node's jobs excluding the node,
uncorrectable fatal error on the link)             then drain_node: the device behind the link is lost
``pcie_aer`` uncorrected non-fatal (error)         notify (a link that may be degrading)
``pcie_aer`` corrected (info)                      nothing
``oom_kill`` (the kernel's OOM killer struck)      notify: names the process; a killed trainer shows up as a
                                                   lost heartbeat (rule ``hang`` restarts the job), memory
                                                   pressure before it is rule ``memory``'s; never a drain
``hung_task`` (a task blocked > 120 s)             notify: often a stuck network filesystem, not the GPU
=================================================  ===========================================================

Only a fatal AER implicates hardware (``_incidents.implicates_hardware``); the others never make a
node a repeat offender.
"""

from __future__ import annotations

from typing import Any

from ftd.plugin import ActionRequest, ClusterView, Event, Kind, Severity, hookimpl
from ftd.plugin.helpers import already_judged, drain, notify, restart_jobs


def _extra(event: Event) -> dict[str, Any]:
    extra = event.data.get("extra")
    return extra if isinstance(extra, dict) else {}


#: The only kinds this rule decides on (the coordinator skips it for the others).
EVENT_KINDS = frozenset({Kind.PCIE_AER, Kind.OOM_KILL, Kind.HUNG_TASK})


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest] | None:
    if already_judged(event):
        return None
    data = event.data
    if event.kind == Kind.PCIE_AER:
        device = data.get("pci") or "?"
        level = _extra(event).get("aer") or str(event.severity)
        reason = f"pcie aer {level} on {device}"
        params = {"pci": data.get("pci")}
        if event.severity == Severity.CRITICAL:
            reason += ": the device behind the link is lost, drain"
            restarts = restart_jobs(view.jobs_on_node(event.node), event, reason, exclude=True, params=params)
            return [*restarts, drain(event, reason, params)]
        if event.severity == Severity.ERROR:
            return [notify(event, reason, params)]
        return None
    if event.kind == Kind.OOM_KILL:
        who = f"{data.get('process') or 'a process'} (pid {data.get('pid', '?')})"
        return [notify(event, f"oom killer killed {who} on {event.node}", {"pid": data.get("pid")})]
    if event.kind == Kind.HUNG_TASK:
        who = f"{data.get('process') or 'a task'} (pid {data.get('pid', '?')})"
        blocked = _extra(event).get("blocked_s")
        span = f" for {blocked}s" if blocked is not None else ""
        return [notify(event, f"hung task: {who} blocked{span} on {event.node}", {"pid": data.get("pid")})]
    return None
