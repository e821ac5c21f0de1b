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
the same, ``peer_connection_lost`` included,     the same, judged on the node the line names
when the line names another node by address     (``data.peer_address``, resolved through the addresses
(``data.peer_address``: "Connection closed by   agents announce): hardware evidence *there* excludes and
peer [ADDR]", "Connect to ADDR failed")         drains that node, not the reporter; without it, the
                                                restart in place names it (``params.peer_node``)
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


def _blamed(event: Event, view: ClusterView) -> str | None:
    """The other node a communication error names by address (``data.peer_address``, resolved through
    the addresses agents announce), None when it names none, an unknown one, or its own node."""
    address = event.data.get("peer_address")
    if not isinstance(address, str) or not address:
        return None
    node = view.node_of_address(address)
    return node if node is not None and node != event.node else None


def _evidence(event: Event, view: ClusterView, node: str | None = None) -> FaultRecord | None:
    """The latest hardware evidence on ``node`` (default: the event's) within the window, if any."""
    found = [
        r
        for r in recent(view, node or event.node, event.ts, EVIDENCE_WINDOW_S)
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
    blamed = _blamed(event, view)
    target = blamed or event.node
    evidence = _evidence(event, view, target)
    if evidence is None:
        actions = app_fault_actions(event, view, jobs, pattern, settings.app_faults)
        if blamed is not None:  # said in the decision: the restart is in place, the suspect named
            actions = [
                ActionRequest(
                    kind=a.kind,
                    target=a.target,
                    reason=f"{a.reason} (the line names {blamed})",
                    params={**a.params, "peer_node": blamed},
                    rule=a.rule,
                    event_id=a.event_id,
                )
                for a in actions
            ]
        return actions or None
    named = f" naming {blamed}" if blamed is not None else ""
    reason = f"{pattern} on {event.node}{named} with hardware evidence on {target}: {_label(evidence)}"
    params = {"pattern": pattern, "evidence": evidence.event_id, "severity": "critical"}
    if blamed is not None:
        params["peer_node"] = blamed
    return [
        *restart_jobs(jobs, event, reason, exclude=True, params=params, node=target),
        drain(event, reason, params, node=target),
    ]
