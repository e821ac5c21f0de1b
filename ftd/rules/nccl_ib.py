"""NCCL failures and InfiniBand links: restart the job in place; drain only on hardware evidence.

==============================================  ==============================================================
event                                           actions
==============================================  ==============================================================
``log_pattern`` ``nccl_*`` / ``ib_*``           checkpoint_restart of the job in place with crash-loop backoff
(watchdog timeout, remote / system / internal   (the job-level application-fault policy, signature ``nccl``:
error, aborted communicator, IB completion /    one hang seen by every rank is one incident; after
retry errors; not ``nccl_warn``,                ``policy.app_fault_restart_limit`` restarts: notify only)
``ib_async_event``) with no hardware evidence
on the node
the same, with hardware evidence on that node   checkpoint_restart excluding the node, then drain_node: the
in the last ``EVIDENCE_WINDOW_S`` (900 s: an    reason names the evidence
NCCL timeout fires up to 10 min after its
cause): an ``ib_link`` down there, an
``ib_device_fatal`` / ``ib_port_error`` line in
its logs, or an Xid/SXid/GPU event that
implicates hardware
the same with no job on the node                nothing (recorded)
``ib_link`` (a port went down)                  notify (the NCCL failure that follows decides; the site pack
                                                ``rules/nccl_ib.toml`` handles a flapping port)
==============================================  ==============================================================
"""

from __future__ import annotations

from ftd.plugin import ActionRequest, ClusterView, Event, FaultRecord, Kind, hookimpl
from ftd.plugin.helpers import already_judged, drain, jobs_of, notify, restart_jobs
from ftd.plugin.settings import RuleSettings
from ftd.rules._incidents import (
    HARDWARE_KINDS,
    IB_HARDWARE_PATTERNS,
    app_fault_actions,
    implicates_hardware,
    is_nccl_pattern,
    recent,
)

EVIDENCE_WINDOW_S = 900.0
#: The kinds that can be hardware evidence (a cheap test before the catalog is asked).
_EVIDENCE_KINDS = HARDWARE_KINDS | {"ib_link", "log_pattern"}


def _evidence(event: Event, view: ClusterView) -> FaultRecord | None:
    """The latest hardware evidence on the event's node within the window, if any."""
    found = [
        r
        for r in recent(view, event.node, event.ts, EVIDENCE_WINDOW_S)
        if r.kind in _EVIDENCE_KINDS
        and (
            (r.kind == "ib_link" and not r.linked)
            or (r.kind == "log_pattern" and r.pattern in IB_HARDWARE_PATTERNS)
            or implicates_hardware(r)
        )
    ]
    return found[-1] if found else None


def _label(record: FaultRecord) -> str:
    if record.kind == "log_pattern":
        return f"{record.pattern} in the node's logs"
    if record.kind == "ib_link":
        extra = record.data.get("extra")
        port = extra.get("interface") if isinstance(extra, dict) else None
        return f"ib link {port or record.pci or ''} down".replace("  ", " ")
    return f"{record.kind} {record.code}" if record.code is not None else record.kind


#: The only kinds this rule decides on (the coordinator skips it for the others).
EVENT_KINDS = frozenset({Kind.IB_LINK, Kind.LOG_PATTERN})


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView, settings: RuleSettings) -> list[ActionRequest] | None:
    if already_judged(event):
        return None
    if event.kind == Kind.IB_LINK:
        extra = event.data.get("extra")
        port = extra.get("interface") if isinstance(extra, dict) else None
        reason = f"ib link {port or event.data.get('pci') or '?'} down on {event.node}"
        return [notify(event, reason, {"pci": event.data.get("pci"), "interface": port})]
    if event.kind != Kind.LOG_PATTERN or not is_nccl_pattern(event.data.get("pattern")):
        return None
    pattern = str(event.data["pattern"])
    jobs = jobs_of(event, view)
    if not jobs:
        return None  # an NCCL failure with no job on the node: nothing to restart (recorded)
    evidence = _evidence(event, view)
    if evidence is None:
        return app_fault_actions(event, view, jobs, pattern, settings.app_faults) or None
    reason = f"{pattern} on {event.node} with hardware evidence: {_label(evidence)}"
    params = {"pattern": pattern, "evidence": evidence.event_id, "severity": "critical"}
    return [*restart_jobs(jobs, event, reason, exclude=True, params=params), drain(event, reason, params)]
