"""Filesystem fill: save while there is still room, stop before the disk is full, keep jobs off it.

==========================================================  ===============================================
event                                                       actions
==========================================================  ===============================================
``fs_fill`` stop level: ``data.level`` "critical" from a    checkpoint_restart of the node's jobs excluding
threshold crossing (``data.reason`` "threshold"/"level",    the node (the requeued job must not land on the
or none), or severity critical outside a forecast           full disk again) + notify
``fs_fill`` forecast (``data.reason`` "forecast", or only   checkpoint of the node's jobs (save only,
``eta_s``/``time_to_full_s`` <= 3600 s), whatever its       ``params.stop = false``: a forecast is a trend,
severity, or ``data.level`` "warning"                       perhaps one burst; training goes on) + notify
``fs_fill`` "ok"/"cleared" level, a stall, anything milder  nothing
``fs_fill`` ``data.reason`` "job_arrived" (the agent: a     checkpoint_restart of that job excluding the
job registered while the mount is still critical)           node + notify
``log_pattern`` ``disk_full`` ("No space left on device")   checkpoint_restart of the job excluding the node
on a node whose last ``fs_fill`` level is still critical    + notify: a job (re)started onto a still-full
                                                            filesystem is moved off it, not left failing
==========================================================  ===============================================

The reason names the mount (``data.mount`` or ``data.path``), the resource that fills
(``data.resource``: "bytes" or "inodes"; inodes read "inodes at 97%"), its fill, and the forecast
when there is one. Every request carries ``params.severity`` (the event's), so the policy gate never
lets the cooldown of a save on a warning hold back the stop on a critical crossing.
"""

from __future__ import annotations

from typing import Any

from ftd.plugin import ActionRequest, ClusterView, Event, Kind, Severity, hookimpl
from ftd.plugin.helpers import jobs_of, notify, number, restart_jobs, save_jobs

SAVE_ETA_S = 3600.0
FULL_WINDOW_S = 24 * 3600.0  # how far back a critical level is remembered for a disk_full line


def is_forecast(event: Event) -> bool:
    return event.data.get("reason") == "forecast"


def level_of(event: Event) -> str:
    """The level of an fs_fill event: "stop", "save" or "" (nothing to do)."""
    data = event.data
    if data.get("stalled") is True or data.get("reason") == "stalled":
        return ""
    level = str(data.get("level", "")).lower()
    if is_forecast(event):
        return "save"  # a trend, not a crossing: never a stop (a critical crossing comes on its own)
    if level in ("ok", "cleared", "clear"):
        return ""
    if level == "critical" or (not level and event.severity == Severity.CRITICAL):
        return "stop"
    eta = eta_of(event)
    if level == "warning" or event.severity == Severity.ERROR or (eta is not None and eta <= SAVE_ETA_S):
        return "save"
    return ""


def eta_of(event: Event) -> float | None:
    """Forecast seconds to full: ``data.eta_s`` or the fs watcher's ``data.time_to_full_s``."""
    eta = number(event.data.get("eta_s"))
    return eta if eta is not None else number(event.data.get("time_to_full_s"))


def describe(event: Event) -> str:
    """ "filesystem /ckpt inodes at 97%, full in ~5m" — the fuller resource, and the forecast."""
    data = event.data
    mount = data.get("mount") or data.get("path") or "?"
    resource = "inodes" if data.get("resource") == "inodes" else "bytes"
    used = number(data.get("inodes_used_pct" if resource == "inodes" else "used_pct"))
    if used is None:
        used = number(data.get("used_pct"))
    text = f"filesystem {mount}"
    if resource == "inodes":
        text += " inodes"
    if used is not None:
        text += f" at {used:.0f}%"
    eta = eta_of(event)
    if eta is not None and (is_forecast(event) or eta <= SAVE_ETA_S):
        text += f", full in ~{_duration(eta)}"
    return text


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _still_critical(event: Event, view: ClusterView) -> dict[str, Any] | None:
    """The data of the node's last fs_fill level event when that level is critical."""
    for record in reversed(view.node_events(event.node)):
        if record.kind != "fs_fill" or not 0 <= event.ts - record.ts <= FULL_WINDOW_S:
            continue
        if record.data.get("reason") in ("forecast", "stalled") or record.data.get("stalled") is True:
            continue
        return dict(record.data) if str(record.data.get("level", "")).lower() == "critical" else None
    return None


#: The only kinds this rule decides on (the coordinator skips it for the others).
EVENT_KINDS = frozenset({Kind.FS_FILL, Kind.LOG_PATTERN})


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest] | None:
    if event.kind == Kind.LOG_PATTERN and event.data.get("pattern") == "disk_full":
        full = _still_critical(event, view)
        if full is None:
            return None
        mount = full.get("mount") or full.get("path") or "?"
        reason = f"disk full in the job's log while filesystem {mount} is still critical: move the job off"
        moved = {"mount": mount, "severity": "critical"}
        restarts = restart_jobs(jobs_of(event, view), event, reason, exclude=True, params=moved)
        return [*restarts, notify(event, reason, moved)] if restarts else None
    if event.kind != Kind.FS_FILL:
        return None
    level = level_of(event)
    if not level:
        return None
    mount = event.data.get("mount") or event.data.get("path") or "?"
    jobs = jobs_of(event, view)
    params: dict[str, Any] = {"mount": mount, "resource": event.data.get("resource") or "bytes"}
    if level == "stop":
        arrived = event.data.get("job") if event.data.get("reason") == "job_arrived" else None
        if arrived:
            reason = f"{describe(event)} and job {arrived} started on it: stop, requeue elsewhere"
        else:
            reason = f"{describe(event)}: save and stop, requeue elsewhere"
        restarts = restart_jobs(jobs, event, reason, exclude=True, params=params)
        return [*restarts, notify(event, reason, params)]
    what = "forecast" if is_forecast(event) else "filling"
    reason = f"{describe(event)} ({what}): save now while there is room"
    return [*save_jobs(jobs, event, reason, params), notify(event, reason, params)]
