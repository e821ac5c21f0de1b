"""A node's own disks: a failing local NVMe / md array / filesystem moves the job, then drains.

=================================================  ===========================================================
event (the node's local storage; a shared           actions
filesystem's is rule ``shared_fs``'s)
=================================================  ===========================================================
``storage`` critical: NVMe disabled after a failed  checkpoint_restart of the node's jobs excluding the node,
reset, removed, not ready; no available path        then drain_node: the disk is gone ("drain after the job
(every I/O to the namespace fails); md array        moved"); the save itself is asked only where the
failed                                              coordinator's save-path check allows (a save onto this
                                                    disk is not asked: :mod:`ftd.plugin.save_path`)
``storage`` error: NVMe timeout with a reset, block  notify: a disk that may be failing; repeats within the
I/O error, buffer I/O error, superblock write        cooldown are one notify
error, filesystem error, md member failed (array
degraded)
``storage`` warning / info                          nothing (recorded)
``fs_readonly`` (ext4 / XFS / btrfs remounted        checkpoint_restart of the node's jobs excluding the node,
read-only, or shut down)                            then drain_node: nothing on it can be written, a save
                                                    there included, and the filesystem needs a repair
=================================================  ===========================================================

``netfs`` (NFS / Lustre) is rule ``shared_fs``'s: one outage seen by many nodes is one cluster
incident, never N drains. A ``storage`` / ``fs_readonly`` event of a shared filesystem (``nfs``,
``lustre``, ... or ``data.shared``) is left to it as well.
"""

from __future__ import annotations

from ftd.plugin import ActionRequest, ClusterView, Event, Kind, Severity, hookimpl
from ftd.plugin.helpers import already_judged, drain, notify, restart_jobs
from ftd.plugin.save_path import is_shared

#: The only kinds this rule decides on (the coordinator skips it for the others).
EVENT_KINDS = frozenset({Kind.STORAGE, Kind.FS_READONLY})


def _what(event: Event) -> str:
    data = event.data
    device = data.get("device") or "?"
    where = f" ({data['mount']})" if isinstance(data.get("mount"), str) else ""
    if event.kind == Kind.FS_READONLY:
        fstype = data.get("fstype") or "filesystem"
        return f"{fstype} on {device}{where} is read-only"
    return f"{data.get('subsystem') or 'disk'} {device}{where}: {data.get('fault') or 'fault'}"


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest] | None:
    if already_judged(event) or event.kind not in EVENT_KINDS or is_shared(str(event.kind), event.data):
        return None
    what = _what(event)
    params = {"device": event.data.get("device"), "mount": event.data.get("mount")}
    if event.kind == Kind.FS_READONLY or event.severity == Severity.CRITICAL:
        reason = f"local storage lost: {what}; move the job, then drain"
        restarts = restart_jobs(view.jobs_on_node(event.node), event, reason, exclude=True, params=params)
        return [*restarts, drain(event, reason, params)]
    if event.severity == Severity.ERROR:
        return [notify(event, f"disk trouble on {event.node}: {what}", params)]
    return None
