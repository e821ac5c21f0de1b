"""Xid catalog policy: turn an Xid's bucket into ftd actions, by the table ``ftd xid explain`` prints.

The decision table is :mod:`ftd.catalog.remedy` (one copy, read by this rule and by ``ftd xid
explain``); this rule carries it out:

=============  =============================================================================================
plan           actions
=============  =============================================================================================
restart        application fault (RESTART_APP, XID_154_EVAL): checkpoint_restart of the node's jobs in place
               with crash-loop backoff (``params.delay_s``); after ``policy.app_fault_restart_limit``
               incidents of the same Xid within ``app_fault_window_s``: notify, no restart. One
               incident (the same Xid on several GPUs or nodes of the job within 60 s) asks once. Never drains
reset          RESET_GPU, WORKFLOW_NVLINK_ERR, WORKFLOW_XID_48, fatal NVLink5 (Xid 144-149 whose message says
               Fatal, Xid 150): checkpoint_restart excluding the node, then gpu_reset of the GPU (``pci``/
               ``uuid``) after the save
drain          RESTART_BM, RESTART_VM, CHECK_MECHANICALS (Xid 79, ``gpu_fallen_off_bus``): checkpoint_restart
               excluding the node, then drain_node with the Xid and GPU in the reason
Xid 48 + 63/64 an Xid 48 with an Xid 63/64 on the same GPU in the same incident (either order, 60 s): drain
               instead of reset (NVIDIA's WORKFLOW_XID_48)
log line       a ``log_pattern`` whose table row names the Xid it reports (``data.xid``, else the built-in
               table's ``xid``: ``cuda_uncorrectable_ecc`` -> 48, ``cuda_device_unavailable`` -> 79): that
               Xid's plan. A line names no GPU: a reset takes the GPU of a DBE the NVML watcher
               reported on the node in the incident window; none: drain instead (the node's GPUs are
               checked before it returns). After the kernel's own Xid of the same fault (48/63/64/94/95
               for 48; 79, the fall-off banner or NVML's ``gpu_missing`` for 79) acted in the window:
               nothing (one fault, one decision)
notify         CONTACT_SUPPORT, UPDATE_SWFW, CHECK_UVM, unknown codes, non-fatal NVLink5: notify only
none           IGNORE, WORKFLOW_XID_45, Xid 154 announcing nothing: recorded only
Xid 154        follows the bucket the driver announces (``data.action``)
=============  =============================================================================================

NVLink5 reasons carry the parser's decode (``extra``: unit, link, sub-code, interrupt info, error
status). Follow-on Xids (``data.caused_by`` / ``data.extra.caused_by_previous``) and storm summaries
(``data.repeat_of``) are recorded, not acted on: their incident already was.
"""

from __future__ import annotations

from typing import Any

from ftd.catalog import load_xid_catalog
from ftd.catalog.log_patterns import xid_counterparts
from ftd.catalog.remedy import XID_48_ESCALATORS, Remedy, resolve_xid
from ftd.plugin import ActionRequest, ClusterView, Event, Kind, hookimpl
from ftd.plugin.helpers import already_judged, drain, gpu_reset, jobs_of, notify, restart_jobs
from ftd.plugin.settings import RuleSettings
from ftd.rules._incidents import INCIDENT_WINDOW_S, app_fault_actions, recent

_XID_48 = 48
#: The kernel's Xids that report the fault a training-log line stands for (its ``xid``): after one of
#: them was acted on in the incident window, the line is the trainer's echo of it.
_SAME_FAULT: dict[int, frozenset[int]] = {48: frozenset({48, 63, 64, 94, 95}), 79: frozenset({79})}


def _describe(remedy: Remedy, data: dict[str, Any]) -> str:
    parts = [f"xid {remedy.code}"]
    if data.get("pci"):
        parts.append(f"gpu {data['pci']}")
    if remedy.name:
        parts.append(remedy.name)
    if remedy.why:
        parts.append(f"({remedy.why})")
    extra = data.get("extra")
    if isinstance(extra, dict) and extra.get("nvlink5_unit"):  # the parser's NVLink5 decode
        detail = [str(extra["nvlink5_unit"])]
        if extra.get("link") is not None:
            detail.append(f"link {extra['link']}")
        if extra.get("sub_code") is not None:
            detail.append(f"sub-code {extra['sub_code']}")
        if extra.get("intr_info"):
            detail.append(f"intr {extra['intr_info']}")
        if extra.get("error_status"):
            detail.append(f"status {extra['error_status']}")
        parts.append(f"[{', '.join(detail)}]")
    return " ".join(parts)


def _same_gpu(a: dict[str, Any], b: Any) -> bool:
    for key in ("uuid", "pci"):
        if a.get(key) and getattr(b, key, None):
            return bool(a[key] == getattr(b, key))
    return True  # one side does not say which GPU: same node, same incident window


def _xid_48_escalated(event: Event, code: int, view: ClusterView) -> bool:
    """An Xid 48 and an Xid 63/64 on the same GPU within one incident window (either order)."""
    partners = XID_48_ESCALATORS if code == _XID_48 else {_XID_48} if code in XID_48_ESCALATORS else set()
    if not partners:
        return False
    return any(
        r.kind == "xid" and r.code in partners and not r.linked and _same_gpu(event.data, r)
        for r in recent(view, event.node, event.ts, INCIDENT_WINDOW_S)
    )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _code(event: Event) -> int | None:
    if event.kind == Kind.GPU_FALLEN_OFF_BUS:
        return 79
    if event.kind == Kind.LOG_PATTERN:  # the Xid the line reports (its table row's ``xid``)
        pattern = event.data.get("pattern")
        own = _int(event.data.get("xid"))
        if own is not None or not isinstance(pattern, str):
            return own
        return xid_counterparts().get(pattern)
    return _int(event.data.get("code"))


def _echo_of_kernel_xid(event: Event, code: int, view: ClusterView) -> bool:
    """A log line after the kernel's own Xid of the same fault, which was acted on, in the window."""
    same = _SAME_FAULT.get(code, frozenset({code}))
    for r in recent(view, event.node, event.ts, INCIDENT_WINDOW_S):
        if r.kind in ("gpu_fallen_off_bus", "gpu_missing") and code == 79:  # NVML's view of it too
            return True
        if r.kind == "xid" and r.code in same and resolve_xid(r.code, r.data).plan != "none":
            return True
    return False


def _gpu_of_recent_dbe(event: Event, view: ClusterView) -> dict[str, Any]:
    """``pci``/``uuid`` of the GPU an uncorrectable ECC error (the NVML watcher's) was reported on."""
    for r in reversed(recent(view, event.node, event.ts, INCIDENT_WINDOW_S)):
        if r.kind == "ecc" and r.data.get("dbe") is True and (r.pci or r.uuid):
            return {key: value for key, value in (("pci", r.pci), ("uuid", r.uuid)) if value}
    return {}


#: The only kinds this rule decides on (the coordinator skips it for the others).
EVENT_KINDS = frozenset({Kind.XID, Kind.GPU_FALLEN_OFF_BUS, Kind.LOG_PATTERN})


@hookimpl
def ftd_startup() -> None:
    """Read the packaged Xid catalog now: parsed lazily, it cost the first Xid event ~50 ms inside
    this rule (a ``slow_rule`` warning on every coordinator's first fault, and that much later a
    decision). The coordinator itself is not needed (the rule's settings come with each event)."""
    load_xid_catalog()


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView, settings: RuleSettings) -> list[ActionRequest] | None:
    if event.kind not in EVENT_KINDS:
        return None
    code = _code(event)
    if code is None or already_judged(event):
        return None
    from_log = event.kind == Kind.LOG_PATTERN
    if from_log and _echo_of_kernel_xid(event, code, view):
        return None
    data = {**event.data, **_gpu_of_recent_dbe(event, view)} if from_log else event.data
    remedy = resolve_xid(code, data)
    plan = remedy.plan
    reason = _describe(remedy, data)
    if from_log:
        where = f" in {data['file']}" if isinstance(data.get("file"), str) else ""
        reason = f"{data.get('pattern')}{where} reports {reason}"
        if plan == "reset" and not (data.get("pci") or data.get("uuid")):
            plan = "drain"
            reason += ": the line names no GPU, so the node is drained for its GPUs to be checked"
    if code == 154:
        reason += f" announces {remedy.bucket}"
    escalated = _xid_48_escalated(event, code, view)
    if escalated:
        plan = "drain"
        reason += f": xid {_XID_48} with xid 63/64 on the same GPU (uncorrectable ECC, no clean remap)"
    if plan == "none":
        return None
    jobs = jobs_of(event, view) if event.data.get("job") else view.jobs_on_node(event.node)
    params: dict[str, Any] = {"code": code, "bucket": remedy.bucket, "pci": data.get("pci")}
    if data.get("uuid"):
        params["uuid"] = data["uuid"]
    if from_log:
        params["pattern"] = data.get("pattern")
    if escalated:
        params["severity"] = "critical"  # never held back by the cooldown of the milder reset
    if plan == "restart":
        return app_fault_actions(event, view, jobs, reason, settings.app_faults) or None
    if plan == "notify":
        return [notify(event, f"{reason}: {remedy.bucket}, a human should look", params)]
    if plan == "drain":
        return [*restart_jobs(jobs, event, reason, exclude=True, params=params), drain(event, reason, params)]
    # reset: save first (the restart excludes the node), then the reset once the GPU is free
    return [*restart_jobs(jobs, event, reason, exclude=True, params=params), gpu_reset(event, reason, params)]
