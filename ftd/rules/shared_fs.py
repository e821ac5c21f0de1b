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
saves to the fallback its trainer declared); the ``recovered`` events end it
(:mod:`ftd.plugin.save_path`).
"""

from __future__ import annotations

from ftd.plugin import ActionRequest, ClusterView, Event, Kind, hookimpl
from ftd.plugin.helpers import already_judged, notify
from ftd.plugin.save_path import NETFS_DOWN, RECOVERED, Trouble, is_shared, troubles

#: The only kinds this rule decides on (the coordinator skips it for the others).
EVENT_KINDS = frozenset({Kind.NETFS, Kind.FS_READONLY, Kind.STORAGE})
#: Nodes reporting the same mount read-only at once that make it a shared filesystem's trouble.
OUTAGE_MIN_NODES = 3


def outage_key(event: Event) -> str | None:
    """What names the filesystem across nodes: the server of a ``netfs`` event, else the mount."""
    data = event.data
    for key in ("server", "mount", "path") if event.kind == Kind.NETFS else ("mount", "path"):
        value = data.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _open(view: ClusterView, event: Event, key: str) -> list[Trouble]:
    """The troubles of that filesystem open now, on any node (this event's included)."""
    nodes = set(view.online_nodes()) | {event.node}
    return [t for t in troubles(view, nodes, event.ts) if key in (t.where, t.server)]


def _jobs(view: ClusterView, event: Event, opened: list[Trouble]) -> list[str]:
    named = {j for t in opened for j in t.jobs}
    jobs = event.data.get("jobs")
    if isinstance(jobs, list):
        named |= {j for j in jobs if isinstance(j, str)}
    return sorted(named)


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest] | None:
    if event.kind not in EVENT_KINDS or already_judged(event):
        return None
    key = outage_key(event)
    if key is None:
        return None
    state = str(event.data.get("state") or "").lower()
    opened = _open(view, event, key)
    others = sorted({t.node for t in opened if t.node != event.node})
    if event.kind == Kind.NETFS and state in RECOVERED:
        if others or not _was_down(view, event, key):
            return None  # still down elsewhere (one incident), or never seen down
        back = f"shared filesystem {key} recovered (last on {event.node}): saves on it resume"
        return [notify(event, back, {"outage": key, "incident": "shared_fs"})]
    if event.kind == Kind.NETFS and state not in NETFS_DOWN:
        return None
    if is_shared(str(event.kind), event.data):
        if others:
            return None  # the outage seen on another node already: the same incident
    elif len(others) + 1 != OUTAGE_MIN_NODES:
        return None  # a local disk (the storage rules), or a crowd counted already
    jobs = _jobs(view, event, opened)
    on_it = f"; jobs saving there: {', '.join(jobs)}" if jobs else ""
    what = {"netfs": f"{event.data.get('fs') or 'network filesystem'} server {key} {state.replace('_', ' ')}"}
    text = what.get(str(event.kind), f"shared filesystem {key} {str(event.kind).replace('_', ' ')}")
    reason = (
        f"shared filesystem outage: {text} (first seen on {event.node}){on_it}; saves on it are paused "
        "until it recovers, and no node is drained for it (one cluster incident, not a node fault)"
    )
    return [notify(event, reason, {"outage": key, "jobs": jobs, "incident": "shared_fs"})]


def _was_down(view: ClusterView, event: Event, key: str) -> bool:
    """Whether ``event.node`` reported ``key`` down before this recovery (so an outage ends here)."""
    for record in reversed(view.node_events(event.node)):
        if record.event_id == event.id or record.kind != "netfs":
            continue
        if key not in (record.data.get("server"), record.data.get("mount")):
            continue
        return record.data.get("state") in NETFS_DOWN
    return False
