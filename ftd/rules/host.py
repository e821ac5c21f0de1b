"""The rest of the host: NICs, GPUDirect, NVLink link masks, machine checks, lockups, oopses,
segfaults and resource limits (kernel-log families, docs/signals.md).

==================================================  ==========================================================
event                                               actions
==================================================  ==========================================================
``nic`` critical (mlx5 command timeout, health      checkpoint_restart of the node's jobs excluding the node,
poll failed, unrecoverable error; EFA admin         then drain_node: the node's fabric adapter is lost
queue timeout / closed, reset failed, not ready)
``nic`` warning (ACCESS_REG failure, insufficient   notify
slot power, EFA admin command failed)
``nic`` info (a transmit queue timeout the kernel   nothing (recorded)
recovers from: NETDEV WATCHDOG)
``nvlink`` (post-RX-detect link mask failure: the   checkpoint_restart excluding the node, then drain_node:
GPU's NVLinks did not train)                        collectives over NVLink fail or crawl there
``machine_check`` uncorrected (critical)            checkpoint_restart excluding the node, then drain_node
``machine_check`` corrected                         nothing (recorded)
``kernel_oops`` critical (oops, kernel BUG at,      checkpoint_restart excluding the node, then drain_node:
NULL dereference, panic)                            the kernel's state cannot be trusted
``kernel_oops`` other (a ``BUG:`` report, a stack   notify
dump, a leaked network device)
``soft_lockup`` (a CPU stuck in the kernel)         notify
``gpudirect`` (nvidia-peermem error)                notify: GPUDirect RDMA broken; the NCCL failure that
                                                    follows decides (rule ``nccl_ib``)
``segfault`` in a GPU library (libnccl, libcuda,    the application-fault path: checkpoint_restart in place
...) of a job's process (``data.job``, set by the   with crash-loop backoff, signature ``log segfault``
agent from the registered ranks' pids)              (the trainer's own segfault line is the same incident)
``segfault`` otherwise                              nothing (recorded)
``resource_limit`` (conntrack table full,           notify
file-max, neighbour table, threads)
==================================================  ==========================================================

IB port flaps stay ``ib_link`` (rule ``nccl_ib``); network filesystems are ``shared_fs``'s; local
disks are ``storage``'s.
"""

from __future__ import annotations

from typing import Any

from ftd.plugin import ActionRequest, ClusterView, Event, Kind, Severity, hookimpl
from ftd.plugin.helpers import already_judged, drain, notify, restart_jobs
from ftd.plugin.settings import RuleSettings
from ftd.rules._incidents import app_fault_actions

#: The only kinds this rule decides on (the coordinator skips it for the others).
EVENT_KINDS = frozenset(
    {
        Kind.NIC,
        Kind.GPUDIRECT,
        Kind.NVLINK,
        Kind.MACHINE_CHECK,
        Kind.SOFT_LOCKUP,
        Kind.KERNEL_OOPS,
        Kind.SEGFAULT,
        Kind.RESOURCE_LIMIT,
    }
)


def _extra(event: Event) -> dict[str, Any]:
    extra = event.data.get("extra")
    return extra if isinstance(extra, dict) else {}


def _describe(event: Event) -> str:
    data, extra = event.data, _extra(event)
    kind = event.kind
    if kind == Kind.NIC:
        device = data.get("device") or extra.get("ibdev") or "?"
        return f"{data.get('driver') or 'nic'} {device} {data.get('fault')}"
    if kind == Kind.NVLINK:
        return f"nvlink {data.get('fault')}" + (f" on gpu {data['gpu']}" if data.get("gpu") else "")
    if kind == Kind.MACHINE_CHECK:
        where = f" cpu {data['cpu']} bank {data.get('bank')}" if data.get("cpu") is not None else ""
        return f"{'uncorrected' if extra.get('uncorrected') else 'corrected'} machine check{where}"
    if kind == Kind.KERNEL_OOPS:
        return f"kernel {data.get('what') or 'oops'}"
    if kind == Kind.SOFT_LOCKUP:
        return f"soft lockup on cpu {data.get('cpu', '?')} ({data.get('process') or '?'})"
    if kind == Kind.GPUDIRECT:
        return f"nvidia-peermem {data.get('fault')}"
    if kind == Kind.RESOURCE_LIMIT:
        return f"{data.get('resource')} limit reached"
    return str(kind)


def _move_and_drain(event: Event, view: ClusterView, what: str) -> list[ActionRequest]:
    reason = f"{what}: move the job, then drain"
    params = {"kind": str(event.kind)}
    restarts = restart_jobs(view.jobs_on_node(event.node), event, reason, exclude=True, params=params)
    return [*restarts, drain(event, reason, params)]


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView, settings: RuleSettings) -> list[ActionRequest] | None:
    if already_judged(event) or event.kind not in EVENT_KINDS:
        return None
    kind, what = event.kind, _describe(event)
    if kind == Kind.SEGFAULT:
        job = event.data.get("job")
        if not _extra(event).get("gpu_library") or not isinstance(job, str) or not job:
            return None  # not a trainer, or not in a GPU library: recorded only
        what = f"segfault in {event.data.get('library')}"
        return app_fault_actions(event, view, [job], what, settings.app_faults) or None
    if kind == Kind.MACHINE_CHECK:
        return (
            _move_and_drain(event, view, what)
            if _extra(event).get("uncorrected") and event.severity == Severity.CRITICAL
            else None
        )
    if kind in (Kind.NIC, Kind.KERNEL_OOPS) and event.severity == Severity.CRITICAL:
        return _move_and_drain(event, view, what)
    if kind == Kind.NVLINK:
        return _move_and_drain(event, view, what)
    if event.severity == Severity.INFO:
        return None  # a transmit queue the kernel reset, a corrected error: recorded only
    return [notify(event, f"{what} on {event.node}", {"kind": str(kind)})]
