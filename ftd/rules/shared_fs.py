"""A shared filesystem's outage is one cluster incident: notify once, pause saves, never drain.

=============================================  ===========================================================
event                                          actions
=============================================  ===========================================================
``netfs`` ``data.state`` not_responding,       the first node to report the server (or mount): notify
evicted, lock_reclaim_failed; or               once, "shared filesystem outage", naming the server, the
``fs_readonly`` / ``storage`` of a shared      jobs that save there and that saves on it are paused; every
filesystem (``data.fstype`` nfs, lustre,       further node reporting the same outage while it lasts:
gpfs, beegfs, ...; ``data.shared``), or of     nothing (the same incident). Never a drain, never a
a mount that ``OUTAGE_MIN_NODES`` nodes        restart: the nodes are fine, their server is not
report at once
``netfs`` ``data.state`` recovered             the last node of an open outage recovering: notify once
                                               "recovered, saves resume"
anything else (a node's local disk)            nothing here: the ``storage`` rules drain the node after its
                                               job moved
=============================================  ===========================================================

While the outage lasts, the coordinator's decision stage (:mod:`ftd.coordinator.decide.save_path`)
asks no save of a job whose checkpoint directory is on that filesystem (it stops without a save, or
saves to the fallback its trainer declared); the ``recovered`` events end it. Which nodes report a
filesystem down is looked up in the view (:meth:`ClusterView.filesystem_troubles`), never scanned
for: an outage seen by 10,000 nodes costs each of their events the same few lookups.
"""

from __future__ import annotations

from ftd.plugin import ActionRequest, ClusterView, Event, Kind, fault_of, hookimpl
from ftd.plugin.helpers import already_judged, notify
from ftd.plugin.save_path import MEMORY_S, is_shared, reading_of, trouble_of

#: The only kinds this rule decides on (the coordinator skips it for the others).
EVENT_KINDS = frozenset({Kind.NETFS, Kind.FS_READONLY, Kind.STORAGE})
#: Nodes reporting the same mount read-only at once that make it a shared filesystem's trouble.
OUTAGE_MIN_NODES = 3


def _others(view: ClusterView, key: str, event: Event, limit: int) -> list[str]:
    """Up to ``limit`` other nodes on which that filesystem is in trouble now."""
    found: list[str] = []
    for node, record in view.filesystem_troubles().get(key, {}).items():
        if node != event.node and 0 <= event.ts - record.ts <= MEMORY_S:
            found.append(node)
            if len(found) >= limit:
                break
    return found


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest] | None:
    if event.kind not in EVENT_KINDS or already_judged(event):
        return None
    fault = fault_of(event)
    reading = reading_of(fault)
    if reading is None:
        return None
    key, where, state = reading
    others = _others(view, key, event, OUTAGE_MIN_NODES)
    if state is None:  # recovered here
        was_down = event.node in view.filesystem_troubles().get(key, {})
        if others or not was_down or event.kind != Kind.NETFS:
            return None  # still down elsewhere (one incident), or never seen down
        back = f"shared filesystem {where} recovered (last on {event.node}): saves on it resume"
        return [notify(event, back, {"outage": key, "incident": "shared_fs"})]
    if is_shared(str(event.kind), event.data):
        if others:
            return None  # the outage seen on another node already: the same incident
    elif len(others) + 1 != OUTAGE_MIN_NODES:
        return None  # a local disk (the storage rules), or a crowd counted already
    trouble = trouble_of(fault)
    jobs = sorted(set(trouble.jobs if trouble else ()))
    on_it = f"; jobs saving there (as reported so far): {', '.join(jobs)}" if jobs else ""
    if event.kind == Kind.NETFS:
        server = event.data.get("server") or where
        how = str(event.data.get("state")).replace("_", " ")
        text = f"{event.data.get('fs') or 'network filesystem'} server {server} {how}"
    else:
        text = f"shared filesystem {where} {'read-only' if state == 'read_only' else state}"
    reason = (
        f"shared filesystem outage: {text} (first seen on {event.node}){on_it}; saves on it are paused "
        "until it recovers, and no node is drained for it (one cluster incident, not a node fault)"
    )
    return [notify(event, reason, {"outage": key, "jobs": jobs, "incident": "shared_fs"})]
