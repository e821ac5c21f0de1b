"""Xid catalog policy: turn NVIDIA's immediate-action bucket for an Xid into ftd actions.

========================  ========================================================================
bucket                    actions
========================  ========================================================================
RESTART_APP               checkpoint_restart of every job on the node (the node stays usable)
RESET_GPU                 checkpoint_restart of every job on the node, excluding it, then gpu_reset
                          of that GPU (params ``pci``/``uuid``; the agent refuses the reset while
                          a process still holds the GPU, so it lands once the job has stopped)
RESTART_BM, fatal and     checkpoint_restart excluding the node, and drain_node with the Xid (and
CONTACT_SUPPORT,          GPU) in the reason — the node needs a reboot or hands-on service
CHECK_MECHANICALS
XID_154                   follows the recovery action the driver announces: the agent puts that
                          action's bucket in ``data["action"]`` (e.g. ``RESET_GPU`` for "GPU
                          Reset Required", ``RESTART_BM`` for "Node Reboot Required"); a bucket
                          still ``XID_154`` (no or unknown announcement) means nothing more
IGNORE                    nothing: the event is recorded in the ledger only
unknown code, others      nothing (recorded); WORKFLOW_* buckets that are fatal drain (as above)
========================  ========================================================================

The "GPU has fallen off the bus" banner (kind ``gpu_fallen_off_bus``) is treated as Xid 79.
Follow-on Xids (``data.caused_by`` or ``data.extra.caused_by_previous`` set by the agent) are
recorded, not acted on: their cause already was.
"""

from __future__ import annotations

from typing import Any

from ftd.catalog import ACTIONS, load_xid_catalog
from ftd.plugin import ActionKind, ActionRequest, ClusterView, Event, Kind, hookimpl
from ftd.plugin.helpers import already_judged, drain, restart_jobs

_CATALOG = load_xid_catalog()  # loaded when the rule is, not on the first Xid (decision latency)

_DRAIN_BUCKETS = frozenset({"RESTART_BM", "RESTART_VM", "CONTACT_SUPPORT", "CHECK_MECHANICALS"})
_RESTART_BUCKETS = frozenset({"RESTART_APP"})
_RESET_BUCKETS = frozenset({"RESET_GPU"})
_QUIET_BUCKETS = frozenset({"IGNORE", "XID_154", "XID_154_EVAL"})


def _describe(code: int, name: str, data: dict[str, Any]) -> str:
    parts = [f"xid {code}"]
    if data.get("pci"):
        parts.append(f"gpu {data['pci']}")
    if name:
        parts.append(name)
    return " ".join(parts)


def bucket_of(code: int, data: dict[str, Any]) -> tuple[str, bool, str]:
    """(bucket, fatal, name) for an Xid, Xid 154 resolved to the recovery action it announces."""
    info = _CATALOG.lookup(code)
    bucket = info.action if info else "UNKNOWN"
    fatal = bool(info and info.fatal)
    name = info.name if info else ""
    if bucket in ("XID_154", "XID_154_EVAL"):
        announced = data.get("action")
        if isinstance(announced, str) and announced in ACTIONS and announced not in _QUIET_BUCKETS:
            return announced, announced in _DRAIN_BUCKETS, name
    return bucket, fatal, name


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest] | None:
    if event.kind == Kind.GPU_FALLEN_OFF_BUS:
        code: Any = 79
    elif event.kind == Kind.XID:
        code = event.data.get("code")
    else:
        return None
    if not isinstance(code, int) or isinstance(code, bool) or already_judged(event):
        return None
    bucket, fatal, name = bucket_of(code, event.data)
    if bucket in _QUIET_BUCKETS:
        return None  # record only
    reason = _describe(code, name, event.data)
    if code == 154:
        reason += f" announces {bucket}"
    jobs = view.jobs_on_node(event.node)
    params: dict[str, Any] = {"code": code, "bucket": bucket, "pci": event.data.get("pci")}
    if event.data.get("uuid"):
        params["uuid"] = event.data["uuid"]

    if bucket in _DRAIN_BUCKETS or (fatal and bucket not in _RESTART_BUCKETS | _RESET_BUCKETS):
        return [*restart_jobs(jobs, event, reason, exclude=True, params=params), drain(event, reason, params)]
    if bucket in _RESET_BUCKETS:
        reset = ActionRequest(kind=ActionKind.GPU_RESET, target=event.node, reason=reason, params=params)
        return [*restart_jobs(jobs, event, reason, exclude=True, params=params), reset]
    if bucket in _RESTART_BUCKETS:
        return restart_jobs(jobs, event, reason, exclude=False, params=params)
    return None
