"""Repeat offenders: a GPU that keeps failing the same hardware way, a GPU that brings its faults along.

==========================================================  ===============================================
situation                                                   actions
==========================================================  ===============================================
a hardware-attributable incident (see below) on a GPU       checkpoint_restart of the node's jobs excluding
whose same signature (GPU UUID, else PCI address / index,   the node, and drain_node "repeat offender"
plus kind and code) already had an earlier, separate
incident within 24 h (``view.node_history``)
an event names a GPU (``data.uuid``) whose record says it   notify (flag the GPU: it failed before, on
is in another node and had hardware faults there (it        ``params.previous_node``); ftd does not drain
moved: the first event from it on its new node)             on this alone
==========================================================  ===============================================

Counted (:func:`ftd.rules._incidents.implicates_hardware`): Xids whose catalog plan is a reset or a
drain (``ftd xid explain`` shows it: the catalog's ``implicates_hardware``), fatal SXids, a missing
GPU, DBE ECC, row-remap failure/pending, NVLink down, retired pages, fatal PCIe AER. **Never
counted**: application Xids (RESTART_APP: 13, 31, 94, ...; they get the job-level crash-loop policy
of ``app_faults``), log patterns (cuda_oom, cuda_error, nccl_*), filesystem and memory pressure,
thermal, storm summaries (``repeat_of``), follow-ons (``caused_by``), hang suspects.

Incidents, not events: records of one signature within 60 s of the incident's first are that one
incident (several lines of one fault), so the second line of a fault never makes its GPU a repeat
offender; and an event inside an incident already judged asks for nothing more. History comes from
the view (read-only; the current event is not in it yet). Windows are measured between event
timestamps, never against a clock.
"""

from __future__ import annotations

from ftd.plugin import ActionRequest, ClusterView, Event, FaultRecord, Severity, fault_of, hookimpl
from ftd.plugin.helpers import drain, jobs_of, notify, restart_jobs
from ftd.rules._incidents import (
    HARDWARE_KINDS,
    hardware_signature,
    implicates_hardware,
    in_open_incident,
    incident_starts,
)

WINDOW_S = 24 * 3600.0


def _label(record: FaultRecord) -> str:
    what = f"{record.kind} {record.code}" if record.code is not None else record.kind
    gpu = record.gpu_id
    return f"{what} on gpu {gpu}" if gpu else what


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest] | None:
    out: list[ActionRequest] = []
    uuid = event.data.get("uuid")
    if isinstance(uuid, str) and uuid:
        gpu = view.gpu(uuid)
        if gpu is not None and gpu.node != event.node:
            elsewhere = [f for f in gpu.faults if f.node != event.node and implicates_hardware(f)]
            if elsewhere:
                last = elsewhere[-1]
                reason = (
                    f"gpu {uuid} arrived in {event.node} with a past: {_label(last)} "
                    f"on {last.node} ({len(elsewhere)} fault(s) elsewhere)"
                )
                params = {"uuid": uuid, "previous_node": last.node, "faults": len(elsewhere)}
                out.append(notify(event, reason, params))
    if event.kind not in HARDWARE_KINDS or event.severity.rank < Severity.ERROR.rank:
        return out or None  # node_history keeps faults (severity >= error) only
    fault = fault_of(event)
    if implicates_hardware(fault):
        signature = hardware_signature(fault)
        past = [
            f
            for f in view.node_history(event.node)
            if f.event_id != event.id
            and 0 <= event.ts - f.ts <= WINDOW_S
            and implicates_hardware(f)
            and hardware_signature(f) == signature
        ]
        starts = incident_starts(past)
        if starts and not in_open_incident(starts, event.ts):
            what = _label(fault)
            reason = f"repeat offender: {what} on {event.node}, {len(starts) + 1} incidents in 24h"
            params = {
                "signature": what,
                "previous_event": past[-1].event_id,
                "incidents": len(starts) + 1,
                "severity": "critical",
            }
            out += restart_jobs(jobs_of(event, view), event, reason, exclude=True, params=params)
            out.append(drain(event, reason, params))
    return out or None
