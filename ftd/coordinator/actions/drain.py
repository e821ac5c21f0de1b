"""drain_node / resume_node through the scheduler; resume only what ftd itself drained.

drain_node has two phases (:mod:`ftd.coordinator.model.plan`): **drain** -- the node takes no new work, at
once, never touching what runs on it (a scheduler offering ``cordon(node, reason)``, Kubernetes,
cordons and taints; otherwise ``drain``: Slurm's drain leaves running jobs alone) -- and **evict**
(a scheduler offering ``evict_node(node)``: Kubernetes evicts the node's pods; nothing for Slurm).
Inside a plan only the eviction waits for the jobs' save and stop, so a bad node is out of service
as soon as the fault is seen and an eviction never races the save handshake.
"""

from __future__ import annotations

from typing import Any

from ftd.coordinator.actions.scheduler import Scheduler
from ftd.coordinator.model.state import ClusterState
from ftd.plugin.actions import ActionRecord

REASON_PREFIX = "ftd: "


def drain_reason(reason: str) -> str:
    return reason if reason.startswith(REASON_PREFIX) else REASON_PREFIX + reason


class DrainNode:
    phases = ("drain", "evict")
    disruptive_phase = 1  # the eviction waits for the jobs' save and stop
    settled_phase = 1  # the jobs' requeue waits for the eviction

    def __init__(self, scheduler: Scheduler, state: ClusterState) -> None:
        self._scheduler = scheduler
        self._state = state

    async def __call__(self, record: ActionRecord) -> dict[str, Any]:
        detail = await self.run_phase(record, "drain")
        detail.update(await self.run_phase(record, "evict"))
        return detail

    async def run_phase(self, record: ActionRecord, phase: str) -> dict[str, Any]:
        node = record.request.target
        if phase == "drain":
            reason = drain_reason(record.request.reason)
            cordon = getattr(self._scheduler, "cordon", None)
            if callable(cordon):
                await cordon(node, reason)
            else:
                await self._scheduler.drain(node, reason)
            self._state.mark_drained(node, reason)
            return {"node": node, "reason": reason, "scheduler": self._scheduler.name}
        if phase == "evict":
            evict = getattr(self._scheduler, "evict_node", None)
            if not callable(evict):
                return {}
            return {"evicted": await evict(node)}
        raise ValueError(f"drain_node has no phase {phase!r}")


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
