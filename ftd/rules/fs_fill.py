"""Filesystem fill: save while there is still room, stop before the disk is full.

=============================================================  ===========================================
``fs_fill`` event                                              actions
=============================================================  ===========================================
stop level: ``data.level`` "critical" (the agent's             checkpoint_restart of the node's jobs
``critical_pct`` crossed), severity critical, or               (save, stop, requeue) + notify
``data.eta_s``/``time_to_full_s`` <= 600
save level: ``data.level`` "warning", a forecast event         checkpoint of the node's jobs (save only,
(``data.reason`` "forecast"), severity error, or eta <= 3600   ``params.stop = false``: training goes on)
                                                               + notify
``data.level`` "ok"/"cleared", or anything milder              nothing
=============================================================  ===========================================

The notify names the mount (``data.mount`` or ``data.path``) and the fill (``data.used_pct``).
"""

from __future__ import annotations

from ftd.plugin import ActionKind, ActionRequest, ClusterView, Event, Kind, Severity, hookimpl
from ftd.plugin.helpers import jobs_of, notify, number, restart_jobs

STOP_ETA_S = 600.0
SAVE_ETA_S = 3600.0


def level_of(event: Event) -> str:
    """The level of an fs_fill event: "stop", "save" or "" (nothing to do)."""
    level = str(event.data.get("level", "")).lower()
    forecast = event.data.get("reason") == "forecast"
    if level in ("ok", "cleared", "clear") and not forecast:
        return ""
    eta = eta_of(event)
    if level == "critical" or event.severity == Severity.CRITICAL or (eta is not None and eta <= STOP_ETA_S):
        return "stop"
    if (
        level in ("warning", "forecast")
        or forecast
        or event.severity == Severity.ERROR
        or (eta is not None and eta <= SAVE_ETA_S)
    ):
        return "save"
    return ""


def eta_of(event: Event) -> float | None:
    """Forecast seconds to full: ``data.eta_s`` or the fs watcher's ``data.time_to_full_s``."""
    eta = number(event.data.get("eta_s"))
    return eta if eta is not None else number(event.data.get("time_to_full_s"))


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest] | None:
    if event.kind != Kind.FS_FILL:
        return None
    level = level_of(event)
    if not level:
        return None
    mount = event.data.get("mount") or event.data.get("path") or "?"
    used = number(event.data.get("used_pct"))
    fill = f" at {used:.0f}%" if used is not None else ""
    eta = eta_of(event)
    when = f", full in ~{eta:.0f}s" if eta is not None else ""
    jobs = jobs_of(event, view)
    params = {"mount": mount}
    if level == "stop":
        reason = f"filesystem {mount}{fill}{when}: save and stop before it is full"
        restarts = restart_jobs(jobs, event, reason, exclude=False, params=params)
        return [*restarts, notify(event, reason, params)]
    reason = f"filesystem {mount}{fill}{when}: save now while there is room"
    saves = [
        ActionRequest(
            kind=ActionKind.CHECKPOINT,
            target=job,
            reason=f"{reason} on {event.node}",
            params={**params, "node": event.node, "stop": False},
        )
        for job in jobs
    ]
    return [*saves, notify(event, reason, params)]
