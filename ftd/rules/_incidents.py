"""Incidents, not events: what the built-in rules share to see one fault as one incident.

One fault surfaces many times: an out-of-bounds kernel in a job on 3 GPUs is three Xid 13 lines, a
CUDA OOM is one line per rank, an NCCL hang one watchdog line per rank and node, storm control sends
a summary (``repeat_of``) and the parser marks follow-ons (``caused_by``,
``extra.caused_by_previous``). Records are linked into one incident when they are linked by that
cause chain, or share a signature and come within :data:`INCIDENT_WINDOW_S` of the incident's first
record (for application faults: on any node of the same job, and only until ftd restarts the job).

Two questions are answered here, from the read-only view's history (pure functions):

* **Does a record implicate hardware?** (:func:`implicates_hardware`) Only those count towards
  making a node a repeat offender: an Xid whose catalog plan is reset or drain
  (:mod:`ftd.catalog.remedy`), a fatal SXid, a missing GPU, a DBE / row-remap failure or pending,
  NVLink down, retired pages, a fatal PCIe AER. Never: application Xids, log patterns, filesystem or
  memory pressure, thermal, storm summaries, follow-ons, hang suspects.
* **What does the job-level policy for application faults say?** (:func:`app_fault_actions`)
  Restart in place with crash-loop backoff (``params["delay_s"]``); after ``restart_limit``
  incidents of the same signature within ``window_s``, notify ("crash loop: xid 13 on job J, 3
  restarts in 3600 s ...") and stop restarting. Never drain. A restart of the job by ftd
  (``view.job_restarts``) ends an incident early: the same fault after it is the next occurrence,
  even inside :data:`INCIDENT_WINDOW_S`.
  The limits are the :class:`~ftd.plugin.settings.AppFaultPolicy` the calling rule was handed
  (``settings.app_faults``, from ``policy.app_fault_*``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ftd.catalog.remedy import resolve_xid
from ftd.plugin import ActionKind, ActionRequest, ClusterView, Event, FaultRecord, fault_of
from ftd.plugin.helpers import notify
from ftd.plugin.settings import AppFaultPolicy

INCIDENT_WINDOW_S = 60.0

#: Log patterns that are an application's own errors (the agent's pattern table names them).
APP_PATTERNS = frozenset(
    {
        "cuda_oom",
        "cuda_error",
        "cuda_illegal_memory_access",
        "cuda_launch_failure",
        "segfault",
        "bus_error",
        "host_oom",
        "torch_elastic_failure",
    }
)
#: NCCL and InfiniBand failures in the logs: every ``nccl_*`` / ``ib_*`` pattern but context lines.
NCCL_CONTEXT_ONLY = frozenset({"nccl_warn", "ib_async_event"})
#: IB log patterns that are evidence of a broken port or HCA on the node that logs them.
IB_HARDWARE_PATTERNS = frozenset({"ib_device_fatal", "ib_port_error"})


#: Communication failures that name the other end by address (gloo and NCCL alike): NCCL-family
#: failures whose decision targets the node the address resolves to (issue #33: peer naming).
PEER_PATTERNS = frozenset({"peer_connection_lost"})


def is_nccl_pattern(pattern: str | None) -> bool:
    """An NCCL or IB failure pattern (``nccl_*``, ``ib_*``, :data:`PEER_PATTERNS`; not the context-only
    ones)."""
    if not isinstance(pattern, str):
        return False
    if pattern in PEER_PATTERNS:
        return True
    return (
        pattern.startswith(("nccl_", "ib_"))
        and not pattern.endswith(("_info", "_warn", "_debug"))
        and pattern not in NCCL_CONTEXT_ONLY
    )


# --- classification ------------------------------------------------------------------------------


def _extra(record: FaultRecord) -> dict[str, Any]:
    extra = record.data.get("extra")
    return extra if isinstance(extra, dict) else {}


#: The kinds :func:`implicates_hardware` can say yes to (a cheap test before building a record).
HARDWARE_KINDS = frozenset(
    {"xid", "gpu_fallen_off_bus", "sxid", "gpu_missing", "ecc", "row_remap", "gpu_health", "pcie_aer"}
)


def implicates_hardware(record: FaultRecord) -> bool:
    """Whether this record, on its own, points at the GPU or the node (see the module docstring)."""
    if record.linked:
        return False
    kind, data = record.kind, record.data
    if kind in ("xid", "gpu_fallen_off_bus"):
        return record.code is not None and resolve_xid(record.code, data).implicates_hardware
    if kind == "sxid":
        fatal = _extra(record).get("fatal")
        return fatal is True or (fatal is None and record.severity == "critical")
    if kind == "gpu_missing":
        return True
    if kind == "ecc":
        return record.signal != "correctable_rate" and data.get("dbe") is True
    if kind == "row_remap":
        reasons = data.get("reasons")
        if isinstance(reasons, list):
            return bool({"failure", "pending", "uncorrectable_grew"} & set(reasons))
        return any(data.get(k) is True for k in ("failure", "pending"))
    if kind == "gpu_health":
        return record.signal in ("nvlink_down", "retired_pages") or data.get("retired_pages_pending") is True
    if kind == "pcie_aer":
        return record.severity == "critical"
    return False


def app_signature(record: FaultRecord) -> str | None:
    """The signature of an application fault (``xid 13``, ``log cuda_oom``, ``nccl``), else None."""
    if record.linked:
        return None
    if record.kind == "xid" and record.code is not None:
        return f"xid {record.code}" if resolve_xid(record.code, record.data).plan == "restart" else None
    if record.kind == "segfault" and _extra(record).get("gpu_library") is True:
        return "log segfault"  # the kernel's line of the trainer's own segfault: one incident
    if record.kind == "log_pattern":
        if record.pattern in APP_PATTERNS:
            return f"log {record.pattern}"
        if is_nccl_pattern(record.pattern):
            return "nccl"  # one hang or network failure reads differently on each rank and node
    return None


def hardware_signature(record: FaultRecord) -> tuple[str, str, int | None]:
    """Per GPU (UUID, else PCI, else index; the node for node-wide faults), kind and code."""
    return (record.gpu_id or "node", record.kind, record.code)


def _restarted_between(restarts: Sequence[float], start: float, ts: float) -> bool:
    return any(start < r <= ts for r in restarts)


def incident_starts(
    records: Iterable[FaultRecord], window: float = INCIDENT_WINDOW_S, restarts: Sequence[float] = ()
) -> list[float]:
    """The start times of the incidents ``records`` form: each opens ``window`` seconds, and a
    restart of the job (``restarts``: when ftd restarted it) closes it early, since a fault after a
    restart is a new occurrence of the job's problem, not the same one seen again."""
    starts: list[float] = []
    for record in sorted(records, key=lambda r: r.ts):
        if (
            not starts
            or record.ts - starts[-1] > window
            or _restarted_between(restarts, starts[-1], record.ts)
        ):
            starts.append(record.ts)
    return starts


def in_open_incident(
    starts: Sequence[float], ts: float, window: float = INCIDENT_WINDOW_S, restarts: Sequence[float] = ()
) -> bool:
    """Whether a record at ``ts`` belongs to the last incident (so it was decided on already): inside
    its window, and the job was not restarted since it began."""
    return (
        bool(starts) and 0 <= ts - starts[-1] <= window and not _restarted_between(restarts, starts[-1], ts)
    )


# --- the job-level application-fault policy --------------------------------------------------------


def app_fault_actions(
    event: Event,
    view: ClusterView,
    jobs: list[str],
    what: str,
    policy: AppFaultPolicy,
    *,
    exclude: bool = False,
) -> list[ActionRequest]:
    """Restart each job in place with crash-loop backoff, or notify once it loops (never drain).

    ``what`` names the fault in the reason ("xid 13 ROBUST_CHANNEL_GR_EXCEPTION"); ``policy`` is the
    calling rule's ``settings.app_faults`` (limits and backoff). An event that
    belongs to an incident already decided on (another GPU, rank or node of the same job within
    :data:`INCIDENT_WINDOW_S`, with no restart of the job since) asks for nothing more; one after
    ftd restarted the job is the next occurrence, counted towards ``restart_limit``. The restart's
    ``params["attempt"]`` tells the policy gate that the crash-loop backoff (``delay_s``), not the
    generic cooldown, paces it."""
    fault = fault_of(event)
    signature = app_signature(fault)
    if signature is None:
        return []
    same = _same_signature(fault, signature)
    oldest = event.ts - policy.window_s
    out: list[ActionRequest] = []
    for job in jobs:
        nodes = set(view.job_nodes(job)) | {event.node}
        past = [
            r
            for node in sorted(nodes)
            for r in view.node_events(node)
            if oldest <= r.ts <= event.ts
            and same(r)
            and r.concerns(job)
            and r.event_id != event.id
            and not r.linked
        ]
        restarts = view.job_restarts(job)
        starts = incident_starts(past, restarts=restarts)
        if in_open_incident(starts, event.ts, restarts=restarts):
            continue  # the same incident, seen on another GPU / rank / node: decided already
        before = len(starts)
        params: dict[str, Any] = {
            "node": event.node,
            "exclude": [event.node] if exclude else [],
            "signature": signature,
            "severity": str(event.severity),
        }
        if before >= policy.restart_limit:
            reason = (
                f"crash loop: {signature} on job {job}, {before} restarts in {policy.window_s:g} s "
                f"and it failed again on {event.node} ({what}; limit {policy.restart_limit}): "
                "not restarting again, a human should look"
            )
            out.append(notify(event, reason, {**params, "job": job, "restarts": before}))
            continue
        delay = policy.delay(before)
        attempt = f"restart {before + 1} of {policy.restart_limit}"
        backoff = f", after {delay:g}s backoff" if delay else ""
        out.append(
            ActionRequest(
                kind=ActionKind.CHECKPOINT_RESTART,
                target=job,
                reason=f"application fault: {what} on {event.node} ({attempt}{backoff})",
                params={**params, "delay_s": delay, "attempt": before + 1},
            )
        )
    return out


#: Longest log line quoted in a stop's reason and params (the whole line stays in the event).
LINE_QUOTE_MAX = 300


def stop_job_actions(event: Event, view: ClusterView, jobs: list[str], what: str) -> list[ActionRequest]:
    """Stop each job without a save or a restart, and notify: a failure that would fail again.

    ``event`` is a ``log_pattern`` whose signature would fail the same way on a restart (a
    configuration error, NaN loss...). The stop is a ``checkpoint_restart`` with ``params.save`` and
    ``params.requeue`` false (the job's ranks are told to stop; nothing saved, nothing requeued), and
    a notify carries the signature and the line. The same pattern on another rank or node of the
    job within :data:`INCIDENT_WINDOW_S` (no restart since) is the same incident: asked once."""
    fault = fault_of(event)
    if fault.pattern is None:
        return []
    same = _same_signature(fault, f"log {fault.pattern}")
    text = event.data.get("text")
    line = text[:LINE_QUOTE_MAX] if isinstance(text, str) else ""
    where = event.data.get("file")
    evidence: dict[str, Any] = {
        "node": event.node,
        "signature": f"log {fault.pattern}",
        "disposition": "stop",
        "line": line,
        "file": where if isinstance(where, str) else None,
        "severity": str(event.severity),
    }
    out: list[ActionRequest] = []
    for job in jobs:
        nodes = set(view.job_nodes(job)) | {event.node}
        past = [
            r
            for node in sorted(nodes)
            for r in view.node_events(node)
            if event.ts - INCIDENT_WINDOW_S <= r.ts <= event.ts
            and same(r)
            and r.concerns(job)
            and r.event_id != event.id
            and not r.linked
        ]
        restarts = view.job_restarts(job)
        if in_open_incident(incident_starts(past, restarts=restarts), event.ts, restarts=restarts):
            continue
        reason = (
            f"application failure that would fail again: {what} on {event.node}: {line!r}; "
            f"stopping job {job} without a save or a restart (a restart fails the same way)"
        )
        out.append(
            ActionRequest(
                kind=ActionKind.CHECKPOINT_RESTART,
                target=job,
                reason=reason,
                params={**evidence, "save": False, "requeue": False, "exclude": []},
            )
        )
        out.append(
            notify(
                event,
                f"job {job} stopped, not restarted: {what} on {event.node} would fail again: {line!r}; "
                "fix the job and resubmit it",
                {**evidence, "job": job},
            )
        )
    return out


def _same_signature(fault: FaultRecord, signature: str) -> Callable[[FaultRecord], bool]:
    """A cheap test for "the same application fault as ``fault``" (field compares, no catalog)."""
    if fault.kind == "xid":
        code = fault.code
        return lambda r: r.kind == "xid" and r.code == code and (code != 154 or app_signature(r) == signature)
    if signature == "nccl":
        return lambda r: r.kind == "log_pattern" and is_nccl_pattern(r.pattern)
    pattern = fault.pattern
    return lambda r: r.kind == "log_pattern" and r.pattern == pattern


def recent(view: ClusterView, node: str, ts: float, window: float) -> list[FaultRecord]:
    """``node``'s events in the ``window`` seconds before ``ts`` (oldest first)."""
    return [r for r in view.node_events(node) if 0 <= ts - r.ts <= window]
