"""drain_node / resume_node through the scheduler; resume only what ftd itself drained."""

from __future__ import annotations

from typing import Any

from ftd.coordinator.actions.scheduler import Scheduler
from ftd.coordinator.state import ClusterState
from ftd.plugin.actions import ActionRecord

REASON_PREFIX = "ftd: "


def drain_reason(reason: str) -> str:
    return reason if reason.startswith(REASON_PREFIX) else REASON_PREFIX + reason


class DrainNode:
    def __init__(self, scheduler: Scheduler, state: ClusterState) -> None:
        self._scheduler = scheduler
        self._state = state

    async def __call__(self, record: ActionRecord) -> dict[str, Any]:
        node = record.request.target
        reason = drain_reason(record.request.reason)
        await self._scheduler.drain(node, reason)
        self._state.mark_drained(node, reason)
        return {"node": node, "reason": reason, "scheduler": self._scheduler.name}


class ResumeNode:
    def __init__(self, scheduler: Scheduler, state: ClusterState) -> None:
        self._scheduler = scheduler
        self._state = state

    async def __call__(self, record: ActionRecord) -> dict[str, Any]:
        node = record.request.target
        info = await self._scheduler.node_info(node)
        if not (info.reason or "").startswith(REASON_PREFIX):
            raise RuntimeError(f"{node} was not drained by ftd (reason {info.reason!r}); leaving it alone")
        await self._scheduler.resume(node)
        self._state.mark_drained(node, "", drained=False)
        return {"node": node, "resumed": True}
