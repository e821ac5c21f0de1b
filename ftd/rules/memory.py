"""Host memory pressure and trainer RSS leaks: save before the OOM killer, then stop if it goes on.

=================================================  ===========================================================
``mem_pressure`` event                             actions
=================================================  ===========================================================
``data.leak`` true (a rank's RSS grows towards     checkpoint of that job (``data.job``; save without stop,
the host's limit), severity warning, first of its  params ``rank``/``pid``): the work is safe before the OOM
job within ``LEAK_WINDOW_S``                       killer strikes
``data.leak`` true again for the job within the    checkpoint_restart of the job in place: it keeps leaking,
window, or severity critical (exhaustion soon)     so save and restart it
``data.level`` "warning" (host memory low / PSI)   checkpoint of the node's jobs (save without stop)
``data.level`` "critical"                          checkpoint_restart of the node's jobs in place
``data.level`` "ok" (cleared)                      nothing
=================================================  ===========================================================

Never a drain, never a repeat offence: memory pressure is the workload's, not the node's fault.
"""

from __future__ import annotations

from typing import Any

from ftd.plugin import ActionRequest, ClusterView, Event, Kind, Severity, hookimpl
from ftd.plugin.helpers import already_judged, jobs_of, number, restart_jobs, save_jobs
from ftd.rules._incidents import recent

LEAK_WINDOW_S = 3600.0


def _leaked_before(event: Event, view: ClusterView, job: str) -> bool:
    return any(
        r.kind == "mem_pressure" and r.data.get("leak") is True and r.job == job and r.event_id != event.id
        for r in recent(view, event.node, event.ts, LEAK_WINDOW_S)
    )


#: The only kinds this rule decides on (the coordinator skips it for the others).
EVENT_KINDS = frozenset({Kind.MEM_PRESSURE})


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest] | None:
    if event.kind != Kind.MEM_PRESSURE or already_judged(event):
        return None
    data = event.data
    critical = event.severity == Severity.CRITICAL
    if data.get("leak") is True:
        jobs = jobs_of(event, view)
        rss, growth = number(data.get("rss_mb")), number(data.get("growth_mb_per_min"))
        tte = number(data.get("time_to_exhaustion_s"))
        who = f"rank {data.get('rank', '?')} of job {data.get('job', '?')}"
        how = f" ({rss:.0f} MB, +{growth:.0f} MB/min" if rss is not None and growth is not None else " ("
        how += f", memory exhausted in ~{tte:.0f}s)" if tte is not None else ")"
        params: dict[str, Any] = {k: data[k] for k in ("rank", "pid") if k in data}
        if critical or any(_leaked_before(event, view, job) for job in jobs):
            reason = f"memory leak continues: {who}{how}: save and restart"
            return restart_jobs(jobs, event, reason, exclude=False, params=params) or None
        reason = f"memory leak: {who}{how}: save before the OOM killer"
        return save_jobs(jobs, event, reason, params) or None
    level = str(data.get("level", "")).lower()
    avail = number(data.get("mem_available_pct"))
    fill = f", {avail:.0f}% available" if avail is not None else ""
    jobs = jobs_of(event, view)
    if level == "critical" or (critical and level != "ok"):
        reason = f"host memory critical{fill}: save and restart"
        return restart_jobs(jobs, event, reason, exclude=False) or None
    if level == "warning":
        return save_jobs(jobs, event, f"host memory low{fill}: save before the OOM killer") or None
    return None
