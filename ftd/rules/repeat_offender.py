"""Repeat offenders: a node that keeps failing the same way, a GPU that brings its faults along.

==========================================================  ===============================================
situation                                                   actions
==========================================================  ===============================================
the same fault (kind + Xid/SXid code) on a node for the     checkpoint_restart of its jobs excluding the
second time within 24 h (``view.node_history``)             node, and drain_node "repeat offender"
an event names a GPU (``data.uuid``) whose record says it   notify (flag the GPU: it failed before, on
is in another node and had faults there (it moved: the      ``params.previous_node``); ftd does not drain
first event from it on its new node)                        on this alone
==========================================================  ===============================================

A fault is an event of severity >= error (what :class:`~ftd.coordinator.state.ClusterState` keeps as
history), except Xids whose catalog bucket is IGNORE, follow-on Xids, and hang suspects
(``rank_heartbeat_lost``, ``log_stale``: the hang rule's, and one hang yields one per silent rank).
History comes from the view (read-only); the engine folds each event into it *after* the rules ran,
so the current event is not in it. The 24 h window is measured between event timestamps, never
against a clock.
"""

from __future__ import annotations

from ftd.plugin import ActionRequest, ClusterView, Event, Kind, Severity, fault_of, hookimpl
from ftd.plugin.helpers import drain, is_follow_on, is_repeat, jobs_of, notify, restart_jobs

WINDOW_S = 24 * 3600.0
_IGNORED_BUCKETS = frozenset({"IGNORE"})


def _counts(event: Event) -> bool:
    if is_repeat(event):  # one incident, however loud: its first occurrence was counted
        return False
    if event.severity.rank < Severity.ERROR.rank or event.kind == Kind.NODE_OFFLINE:
        return False
    if event.kind in (Kind.RANK_HEARTBEAT_LOST, Kind.LOG_STALE):
        # Hang suspects are the hang rule's (restart in place: a hang is no proof of bad hardware).
        # One hang silences every rank blocked in the collective at once: N events, one incident.
        return False
    if event.kind in (Kind.XID, Kind.SXID):
        return not is_follow_on(event) and event.data.get("action") not in _IGNORED_BUCKETS
    return True


def _label(kind: str, code: int | None) -> str:
    return f"{kind} {code}" if code is not None else kind


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest] | None:
    out: list[ActionRequest] = []
    uuid = event.data.get("uuid")
    if isinstance(uuid, str) and uuid:
        gpu = view.gpu(uuid)
        if gpu is not None and gpu.node != event.node:
            elsewhere = [f for f in gpu.faults if f.node != event.node]
            if elsewhere:
                last = elsewhere[-1]
                reason = (
                    f"gpu {uuid} arrived in {event.node} with a past: {_label(last.kind, last.code)} "
                    f"on {last.node} ({len(elsewhere)} fault(s) elsewhere)"
                )
                params = {"uuid": uuid, "previous_node": last.node, "faults": len(elsewhere)}
                out.append(notify(event, reason, params))
    if _counts(event):
        fault = fault_of(event)
        previous = [
            f
            for f in view.node_history(event.node)
            if f.signature == fault.signature and 0 <= event.ts - f.ts <= WINDOW_S and f.event_id != event.id
        ]
        if previous:
            what = _label(fault.kind, fault.code)
            reason = f"repeat offender: {what} on {event.node} {len(previous) + 1} times in 24h"
            params = {"signature": what, "previous_event": previous[-1].event_id}
            out += restart_jobs(jobs_of(event, view), event, reason, exclude=True, params=params)
            out.append(drain(event, reason, params))
    return out or None
