"""The fabric's passive checks (issue #35): a fatal link fault leaves the pool; congestion is the fabric's.

==============================================  ==============================================================
event                                           actions
==============================================  ==============================================================
``fabric`` ``check = "counter"``, ``status =    checkpoint_restart of the node's jobs excluding the node, then
"crossed"``, class ``fatal`` (symbol errors     drain_node: the link corrupts or drops; the reason names the
over the bit-error-rate limit, ``link_downed``, counter, its rate and the threshold (the policy gate decides)
local link integrity, buffer overrun)
the same, class ``warning`` (receive errors,    notify
NVLink replays, discards ...); ``port_rate``
degraded (a port below its profile's rate)
the same, class ``congestion`` (PFC pause       notify "fabric congestion": the fabric, not the node or the
frames, ECN/CNP, out of buffer over their       job, is slow; never a drain. A hang verdict on a job whose
rate)                                           nodes reported congestion in the last 15 minutes says so
                                                (rule ``hang``)
``pcie_link`` degraded or limited (lanes or     notify with the lanes and generations lost and the bandwidth
generation below the maximum)                   left
``cleared`` / ``recovered`` / ``skipped``       nothing (recorded)
(``info``)
==============================================  ==============================================================
"""

from __future__ import annotations

from ftd.plugin import ActionRequest, ClusterView, Event, Kind, hookimpl
from ftd.plugin.helpers import already_judged, drain, notify, restart_jobs

#: The only kinds this rule decides on (the coordinator skips it for the others).
EVENT_KINDS = frozenset({Kind.FABRIC, Kind.PCIE_LINK})


def _where(event: Event) -> str:
    data = event.data
    netdev = data.get("netdev")
    port = data.get("port")
    device = data.get("device") or "?"
    where = f"{device} port {port}" if port is not None else str(device)
    return f"{where} ({netdev})" if netdev else where


def _counter(event: Event, view: ClusterView) -> list[ActionRequest]:
    data = event.data
    if data.get("status") != "crossed":
        return []
    klass = data.get("class")
    counter = data.get("counter")
    rate = f"{data.get('per_hour')}/h, {data.get('per_s')}/s"
    params = {
        "counter": counter,
        "source": data.get("source"),
        "class": klass,
        "profile": data.get("profile"),
    }
    if klass == "fatal":
        reason = (
            f"fabric link fault on {event.node}: {counter} on {_where(event)} at {rate} "
            f"({data.get('threshold')}, fatal)"
        )
        params["severity"] = "critical"
        jobs = view.jobs_on_node(event.node)
        return [*restart_jobs(jobs, event, reason, exclude=True, params=params), drain(event, reason, params)]
    if klass == "congestion":
        reason = (
            f"fabric congestion on {event.node}: {counter} on {_where(event)} at {data.get('per_s')}/s "
            f"({data.get('threshold')}): the fabric is slow, not the node or the job"
        )
        return [notify(event, reason, params)]
    reason = f"fabric {counter} on {_where(event)} of {event.node} at {rate} ({data.get('threshold')})"
    return [notify(event, reason, params)]


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest] | None:
    if event.kind not in EVENT_KINDS or already_judged(event) or event.severity == "info":
        return None
    data = event.data
    if event.kind == Kind.PCIE_LINK:
        if data.get("status") not in ("degraded", "limited"):
            return None
        reason = (
            f"pcie link of {data.get('device') or '?'} {data.get('pci') or ''} on {event.node}: "
            f"x{data.get('cur_width')} of x{data.get('max_width')}, {data.get('cur_speed_gts')} of "
            f"{data.get('max_speed_gts')} GT/s ({data.get('bandwidth_pct')}% of its bandwidth)"
        )
        params = {key: data.get(key) for key in ("pci", "lanes_lost", "gens_lost", "bandwidth_pct", "what")}
        return [notify(event, reason, params)]
    if data.get("check") == "counter":
        return _counter(event, view) or None
    if data.get("check") == "port_rate" and data.get("status") == "degraded":
        reason = (
            f"ib port {_where(event)} of {event.node} runs at {data.get('rate_gbps')} Gb/s "
            f"{data.get('width') or ''} of {data.get('expected_gbps')} Gb/s "
            f"{data.get('expected_width') or ''} ({data.get('profile')})"
        )
        return [notify(event, reason.replace("  ", " "), {"pct": data.get("pct")})]
    return None
