"""Xid catalog policy: turn NVIDIA's immediate-action bucket for an Xid into ftd actions.

========================  ========================================================================
bucket                    actions
========================  ========================================================================
RESTART_APP               checkpoint_restart of every job on the node (the node stays usable)
RESET_GPU                 checkpoint_restart excluding the node, then gpu_reset of that GPU
RESTART_BM / fatal        checkpoint_restart excluding the node, and drain_node with the Xid
                          (and GPU) in the reason — the node needs a reboot or hands-on service
IGNORE, unknown, others   nothing (the event is still recorded in the ledger)
========================  ========================================================================

The "GPU has fallen off the bus" banner (kind ``gpu_fallen_off_bus``) is treated as Xid 79.
Follow-on Xids (``data.caused_by`` set by the agent's storm control) are recorded, not acted on:
their cause already was.
"""

from __future__ import annotations

from typing import Any

from ftd.catalog import load_xid_catalog
from ftd.coordinator.hookspecs import hookimpl
from ftd.coordinator.model import ActionKind, ActionRequest
from ftd.coordinator.state import ClusterView
from ftd.events import Event, Kind

_CATALOG = load_xid_catalog()  # loaded when the rule is, not on the first Xid (decision latency)

_DRAIN_BUCKETS = frozenset({"RESTART_BM", "CONTACT_SUPPORT", "CHECK_MECHANICALS"})
_RESTART_BUCKETS = frozenset({"RESTART_APP"})
_RESET_BUCKETS = frozenset({"RESET_GPU"})


def _describe(code: int, name: str, data: dict[str, Any]) -> str:
    parts = [f"xid {code}"]
    if data.get("pci"):
        parts.append(f"gpu {data['pci']}")
    if name:
        parts.append(name)
    return " ".join(parts)


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest] | None:
    if event.kind == Kind.GPU_FALLEN_OFF_BUS:
        code: Any = 79
    elif event.kind == Kind.XID:
        code = event.data.get("code")
    else:
        return None
    if not isinstance(code, int) or event.data.get("caused_by") is not None:
        return None
    info = _CATALOG.lookup(code)
    bucket = info.action if info else "UNKNOWN"
    fatal = bool(info and info.fatal)
    reason = _describe(code, info.name if info else "", event.data)
    jobs = view.jobs_on_node(event.node)
    params = {"code": code, "bucket": bucket, "pci": event.data.get("pci")}

    def restart(exclude: bool) -> list[ActionRequest]:
        return [
            ActionRequest(
                kind=ActionKind.CHECKPOINT_RESTART,
                target=job,
                reason=f"{reason} on {event.node}",
                params={**params, "node": event.node, "exclude": [event.node] if exclude else []},
            )
            for job in jobs
        ]

    if bucket in _DRAIN_BUCKETS or (fatal and bucket not in _RESTART_BUCKETS | _RESET_BUCKETS):
        drain = ActionRequest(kind=ActionKind.DRAIN_NODE, target=event.node, reason=reason, params=params)
        return [*restart(exclude=True), drain]
    if bucket in _RESET_BUCKETS:
        reset = ActionRequest(kind=ActionKind.GPU_RESET, target=event.node, reason=reason, params=params)
        return [*restart(exclude=True), reset]
    if bucket in _RESTART_BUCKETS:
        return restart(exclude=False)
    return None
