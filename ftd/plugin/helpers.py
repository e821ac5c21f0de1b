"""Small helpers the built-in rules share (pure functions; not a plugin)."""

from __future__ import annotations

from typing import Any

from ftd.plugin import ActionKind, ActionRequest, ClusterView, Event


def is_follow_on(event: Event) -> bool:
    """A follow-on Xid (the agent linked it to its cause, or the driver said "caused by previous")."""
    extra = event.data.get("extra")
    return event.data.get("caused_by") is not None or (
        isinstance(extra, dict) and extra.get("caused_by_previous") not in (None, False)
    )


def is_repeat(event: Event) -> bool:
    """A storm-control summary: ``count`` more of an event whose first occurrence was already judged."""
    return event.data.get("repeat_of") is not None


def already_judged(event: Event) -> bool:
    """Acting on this event would act twice on one incident: its cause or first occurrence was judged."""
    return is_follow_on(event) or is_repeat(event)


def jobs_of(event: Event, view: ClusterView) -> list[str]:
    """The jobs an event concerns: ``data.job`` when the event names one, else every job on the node."""
    job = event.data.get("job")
    if isinstance(job, str | int) and not isinstance(job, bool) and str(job):
        return [str(job)]
    jobs = event.data.get("jobs")
    if isinstance(jobs, list) and jobs and all(isinstance(j, str) for j in jobs):
        return sorted(set(jobs) | set(view.jobs_on_node(event.node)))
    return view.jobs_on_node(event.node)


def gpu_params(event: Event) -> dict[str, Any]:
    """The GPU an event names: ``pci``, ``uuid``, ``index`` (the NVML watcher's ``gpu`` is the index)."""
    params = {key: event.data[key] for key in ("pci", "uuid", "index") if event.data.get(key) is not None}
    gpu = event.data.get("gpu")
    if "index" not in params and isinstance(gpu, int) and not isinstance(gpu, bool):
        params["index"] = gpu
    return params


def gpu_name(event: Event) -> str:
    """``gpu <uuid|pci|index>`` for reason texts."""
    params = gpu_params(event)
    return f"gpu {params.get('uuid') or params.get('pci') or params.get('index', '?')}"


def restart_jobs(
    jobs: list[str],
    event: Event,
    reason: str,
    *,
    exclude: bool,
    params: dict[str, Any] | None = None,
    node: str | None = None,
) -> list[ActionRequest]:
    """Restart each job; ``exclude`` leaves out ``node`` (default: the event's node; another node when
    the event blames it, e.g. the peer a connection error names)."""
    node = node or event.node
    return [
        ActionRequest(
            kind=ActionKind.CHECKPOINT_RESTART,
            target=job,
            reason=f"{reason} on {node}",
            params={
                "severity": str(event.severity),
                **(params or {}),
                "node": node,
                "exclude": [node] if exclude else [],
            },
        )
        for job in jobs
    ]


def save_jobs(
    jobs: list[str], event: Event, reason: str, params: dict[str, Any] | None = None
) -> list[ActionRequest]:
    """A save without a stop (``checkpoint``, ``params.stop = false``) for each job: training goes on."""
    return [
        ActionRequest(
            kind=ActionKind.CHECKPOINT,
            target=job,
            reason=f"{reason} on {event.node}",
            params={"severity": str(event.severity), **(params or {}), "node": event.node, "stop": False},
        )
        for job in jobs
    ]


def drain(
    event: Event, reason: str, params: dict[str, Any] | None = None, *, node: str | None = None
) -> ActionRequest:
    """Drain ``node`` (default: the event's node)."""
    return ActionRequest(
        kind=ActionKind.DRAIN_NODE,
        target=node or event.node,
        reason=reason,
        params={"severity": str(event.severity), **(params or {})},
    )


def gpu_reset(event: Event, reason: str, params: dict[str, Any] | None = None) -> ActionRequest:
    """A GPU reset on the event's node (``pci``/``uuid``/``index`` in params; the agent refuses it
    while a process holds the GPU, so it follows the save of the jobs restarted with it)."""
    return ActionRequest(
        kind=ActionKind.GPU_RESET,
        target=event.node,
        reason=reason,
        params={"severity": str(event.severity), **(params or {})},
    )


def notify(event: Event, reason: str, params: dict[str, Any] | None = None) -> ActionRequest:
    return ActionRequest(
        kind=ActionKind.NOTIFY,
        target=event.node,
        reason=reason,
        params={"kind": str(event.kind), "severity": str(event.severity), **(params or {})},
    )


def number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
