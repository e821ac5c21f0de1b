"""Hangs: find the culprit first (issue #33), then act on the verdict.

==============================================  ============================================================
event                                           actions
==============================================  ============================================================
``rank_heartbeat_lost``, ``log_stale``, or      one ``diagnose_hang`` of the job (``data.job``, else every
``log_pattern`` ``nccl_watchdog_timeout`` /     job on the node): every node with ranks of it collects its
``nccl_watchdog_stuck``                         evidence, the coordinator draws the verdict (the policy
                                                gate keeps one per job: the action key is the job)
``hang_verdict``: ``culprit``, confident        checkpoint_restart of the job **without** the culprit
                                                node(s) (``exclude``; a spare of ``ftd run`` takes the
                                                slot in place, else the scheduler requeues elsewhere),
                                                no save first (``save = false``: a hung job cannot save);
                                                drain_node of each culprit node as a *suspect*
                                                (``params.suspect``): it comes back only after its
                                                preflight passes (return to service, when ``hang`` is
                                                one of ``coordinator.return_to_service.rules``; else a
                                                human resumes it); notify with the verdict
``hang_verdict``: ``job_wide``, ``unknown`` or  ``data.unclear`` (``coordinator.hang_unclear``):
not confident                                   ``restart`` -> checkpoint_restart in place (no node
                                                excluded, no save); ``stop`` -> stopped without a
                                                requeue; notify with the verdict either way. Never
                                                excludes a node.
==============================================  ============================================================

The verdict's sentence, the merged stack tree and where each piece of evidence came from travel in
the restart's and the notification's params (the notification's body shows them). When the job's
nodes reported fabric congestion in the 15 minutes before the verdict (a ``fabric`` event of class
``congestion``: a PFC pause storm, ECN/CNP, out of buffer; rule ``fabric``), the notification says so
(``params.fabric_congestion``): the hang may be the fabric's, not the application's.
"""

from __future__ import annotations

from typing import Any

from ftd.plugin import ActionKind, ActionRequest, ClusterView, Event, Kind, Severity, fault_of, hookimpl
from ftd.plugin.helpers import already_judged, jobs_of
from ftd.rules._incidents import INCIDENT_WINDOW_S, app_signature, in_open_incident, incident_starts

#: The only kinds this rule decides on (the coordinator skips it for the others).
EVENT_KINDS = frozenset({Kind.RANK_HEARTBEAT_LOST, Kind.LOG_STALE, Kind.LOG_PATTERN, Kind.HANG_VERDICT})
#: Log patterns of a collective that stopped moving (ftd/catalog/log_patterns.toml).
HANG_PATTERNS = frozenset({"nccl_watchdog_timeout", "nccl_watchdog_stuck"})
_NO_SAVE = "the job is hung: its ranks cannot take a checkpoint"
CONGESTION_WINDOW_S = 900.0


def _symptom(event: Event) -> str | None:
    """What the event says about a hang, or None when it says nothing about one."""
    rank = event.data.get("rank")
    subject = f"rank {rank} " if isinstance(rank, int) and not isinstance(rank, bool) else ""
    if event.kind == Kind.RANK_HEARTBEAT_LOST:
        return f"hang suspected: {subject}heartbeat lost"
    if event.kind == Kind.LOG_STALE:
        path = event.data.get("path")
        return f"hang suspected: {str(path)[:200] + ' ' if path else subject}log stale"
    pattern = event.data.get("pattern")
    if event.kind == Kind.LOG_PATTERN and isinstance(pattern, str) and pattern in HANG_PATTERNS:
        return f"hang suspected: {pattern} in {subject or 'a '}log"
    return None


def _seen_already(event: Event, view: ClusterView, job: str) -> bool:
    """A watchdog line of an incident already seen (another rank's or node's line of the same hang)."""
    signature = app_signature(fault_of(event))
    if event.kind != Kind.LOG_PATTERN or signature is None:
        return False
    past = [
        r
        for node in sorted(set(view.job_nodes(job)) | {event.node})
        for r in view.node_events(node)
        if event.ts - INCIDENT_WINDOW_S <= r.ts <= event.ts
        and app_signature(r) == signature
        and r.concerns(job)
        and r.event_id != event.id
    ]
    restarts = view.job_restarts(job)
    return in_open_incident(incident_starts(past, restarts=restarts), event.ts, restarts=restarts)


def _diagnose(event: Event, view: ClusterView, reason: str) -> list[ActionRequest]:
    rank = event.data.get("rank")
    return [
        ActionRequest(
            kind=ActionKind.DIAGNOSE_HANG,
            target=job,
            reason=f"{reason} on {event.node}",
            params={
                "node": event.node,  # the cooldown is per job and node where it was seen
                "trigger": str(event.kind),
                **({"rank": rank} if isinstance(rank, int) and not isinstance(rank, bool) else {}),
            },
        )
        for job in jobs_of(event, view)
        if not _seen_already(event, view, job)
    ]


def _strings(value: Any) -> list[str]:
    return [str(v) for v in value if isinstance(v, str | int)] if isinstance(value, list) else []


def _congestion(view: ClusterView, nodes: list[str], ts: float) -> list[str]:
    """``node: counter`` of each fabric congestion the job's nodes reported within the window."""
    found = []
    for node in nodes:
        for record in view.node_events(node):
            data = record.data
            if (
                record.kind == "fabric"
                and 0 <= ts - record.ts <= CONGESTION_WINDOW_S
                and isinstance(data, dict)
                and data.get("class") == "congestion"
                and data.get("status") == "crossed"
            ):
                found.append(f"{node}: {data.get('counter')} on {data.get('netdev') or data.get('device')}")
    return sorted(set(found))


def _on_verdict(event: Event, view: ClusterView) -> list[ActionRequest]:
    data = event.data
    job = data.get("job")
    if not isinstance(job, str | int) or isinstance(job, bool) or not str(job):
        return []
    job = str(job)
    kind = str(data.get("verdict") or "unknown")
    culprits = _strings(data.get("culprit_nodes"))
    confident = data.get("confident") is True
    why = str(data.get("why") or "")[:500]
    told: dict[str, Any] = {
        "verdict": kind,
        "confident": confident,
        "why": why,
        "culprit_nodes": culprits,
        "culprit_ranks": [r for r in data.get("culprit_ranks") or [] if isinstance(r, int)],
        "evidence": _strings(data.get("evidence")),
        "tree": str(data.get("tree") or ""),
        "diagnosis": data.get("action_id"),
    }
    restart: dict[str, Any] = {"severity": str(event.severity), "save": False, "no_save_reason": _NO_SAVE}
    if kind == "culprit" and confident and culprits:
        reason = f"hang: culprit {', '.join(culprits)}: {why}"
        actions = [
            ActionRequest(
                kind=ActionKind.CHECKPOINT_RESTART,
                target=job,
                reason=reason,
                params={**restart, "node": culprits[0], "exclude": culprits, "hang_verdict": kind},
            )
        ]
        actions += [
            ActionRequest(
                kind=ActionKind.DRAIN_NODE,
                target=node,
                reason=f"hang culprit of job {job} ({why}); suspect: back only after its preflight passes",
                params={"severity": "error", "suspect": True, "job": job, "diagnosis": data.get("action_id")},
            )
            for node in culprits
        ]
        what = f"job {job} hung; culprit {', '.join(culprits)} excluded: {why}"
    else:
        stop = data.get("unclear") == "stop"
        actions = [
            ActionRequest(
                kind=ActionKind.CHECKPOINT_RESTART,
                target=job,
                reason=f"hang: {kind}{'' if confident else ' (not confident)'}: {why}",
                params={
                    **restart,
                    "node": event.node,
                    "exclude": [],
                    "hang_verdict": kind,
                    **({"requeue": False} if stop else {}),
                },
            )
        ]
        then = "stopped, not restarted" if stop else "restarted in place, no node excluded"
        what = f"job {job} hung ({kind}{'' if confident else ', not confident'}); {then}: {why}"
    congested = _congestion(view, sorted({*view.job_nodes(job), *culprits, event.node}), event.ts)
    if congested:
        told["fabric_congestion"] = congested
        what += f" (fabric congestion meanwhile: {'; '.join(congested)[:300]})"
    actions.append(
        ActionRequest(
            kind=ActionKind.NOTIFY,
            target=event.node,
            reason=what,
            params={"kind": str(event.kind), "severity": str(event.severity), "job": job, **told},
        )
    )
    return actions


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest] | None:
    if event.kind == Kind.HANG_VERDICT:
        if event.source != "coordinator":  # only the coordinator's own verdict is acted on
            return None
        return _on_verdict(event, view) or None
    reason = _symptom(event)
    if reason is None or already_judged(event):
        return None
    if event.kind == Kind.LOG_PATTERN and event.severity not in (Severity.ERROR, Severity.CRITICAL):
        return None
    return _diagnose(event, view, reason) or None
