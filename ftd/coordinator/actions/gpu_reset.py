"""gpu_reset (coordinator side): ask the node's agent to reset one GPU; retry, then escalate.

The request's target is the node; ``params`` name the GPU (any of ``pci``, ``uuid``, ``index``; the
agent resolves and cross-checks them). A ``gpu_reset`` :class:`~ftd.events.Directive` goes to
``ftd/v1/nodes/{node}/directives`` with ``deadline_s``; the agent answers on its acks topic with an
:class:`~ftd.events.Ack` for the directive id, ``rank = -1`` (:data:`NODE_RANK`: a node-level answer,
not a trainer's), ``ok`` and a ``reason`` such as ``"refused: GPU in use by pid(s) 4242"`` or
``"reset_ok: ..."``. The agent refuses while any process holds the GPU (docs/architecture.md §11.3).

Two phases (:class:`~ftd.coordinator.model.plan.PhasedExecutor`; inside a plan the job's save and stop
come before the first, and the job's requeue waits for the first):

1. **reset** -- ask; a *refusal* (the GPU is still held: a rank still exiting, a stray process) is
   asked again with backoff (``retry_backoff_s``, doubling, at most 30 s apart) for up to
   ``retry_s``: each try is a new directive (``{action id}-gpu_reset-{n}``; the agent answers a
   directive id once), and the agent checks the holders again each time (polling the agent is how
   we learn the GPU is free). Every try is in ``detail["attempts"]``. A reset done -> succeeded.
   Not done (still refused at the end, the reset failed, or no answer by ``deadline_s``) ->
   **escalation**: ``scheduler.reboot(node, nextstate="RESUME")`` (Slurm: ``scontrol reboot ASAP``,
   the node takes no new work until it rebooted); a scheduler that cannot reboot (Kubernetes) or
   refuses (no ``RebootProgram``) -> ``scheduler.drain`` for RMA. Either way the action is
   *escalated*, with ``detail["escalation"]`` = ``"reboot"`` / ``"drain"``. Without a scheduler it
   *fails* (nothing left to do).
2. **verify** -- only after a reboot: wait up to ``reboot_deadline_s`` for the node's agent to come
   back (its status ``online``, stamped after the reboot was asked for), then ask it to check the GPU
   (``params["check_only"]``: listed again, no reset). Healthy -> ``detail["reboot_cleared"]``;
   still bad -> drained for RMA (``detail["escalation"] = "reboot+drain"``). The agent not back by
   the deadline -> ``detail["reboot_unconfirmed"]`` (the node stays out of service as the
   scheduler's reboot leaves it until it happens).

Idempotent by action id: directive ids derive from it, so a resumed action re-sends the *same*
directives (an agent that already handled one answers again from its record instead of resetting
twice) and an answer that arrived before the restart is still accepted.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ftd.coordinator.actions.acks import AckBook
from ftd.coordinator.actions.directive import NodeSend, ask_node, directive_for
from ftd.coordinator.actions.scheduler import Scheduler, SchedulerError
from ftd.coordinator.model.plan import merge_state
from ftd.coordinator.model.state import ClusterState
from ftd.events import Ack
from ftd.logs import get_logger
from ftd.plugin.actions import ActionRecord, ActionState

log = get_logger(__name__)

GPU_KEYS = ("pci", "uuid", "index")
MAX_BACKOFF_S = 30.0


class GpuReset:
    phases = ("reset", "verify")

    def __init__(
        self,
        *,
        send: NodeSend,
        acks: AckBook,
        deadline_s: float,
        scheduler: Scheduler | None = None,
        state: ClusterState | None = None,
        retry_s: float = 0.0,
        retry_backoff_s: float = 1.0,
        reboot_deadline_s: float = 1800.0,
        reboot_poll_s: float = 1.0,
    ) -> None:
        """``retry_s`` 0: a refusal is not asked again (the coordinator passes its configuration:
        ``gpu_reset_retry_s`` and friends); ``reboot_poll_s``: how often the verify phase looks for
        the rebooted node's agent."""
        self._send = send
        self._acks = acks
        self.deadline_s = deadline_s
        self._scheduler = scheduler
        self._state = state
        self.retry_s = retry_s
        self.retry_backoff_s = retry_backoff_s
        self.reboot_deadline_s = reboot_deadline_s
        self.reboot_poll_s = reboot_poll_s

    async def __call__(self, record: ActionRecord) -> dict[str, Any]:
        """Both phases in a row (outside a plan)."""
        detail = await self.run_phase(record, "reset")
        record.detail.update(detail)
        state = detail.pop("state", None)
        more = await self.run_phase(record, "verify")
        state = merge_state(state, more.pop("state", None))
        detail.update(more)
        if state is not None:
            detail["state"] = state
        return detail

    async def run_phase(self, record: ActionRecord, phase: str) -> dict[str, Any]:
        if phase == "reset":
            return await self._reset(record)
        if phase == "verify":
            return await self._verify(record)
        raise ValueError(f"gpu_reset has no phase {phase!r}")

    def _gpu(self, record: ActionRecord) -> dict[str, Any]:
        gpu = {k: record.request.params[k] for k in GPU_KEYS if record.request.params.get(k) is not None}
        if not gpu:
            raise ValueError("gpu_reset needs params.pci, params.uuid or params.index")
        return gpu

    async def _ask(self, record: ActionRecord, suffix: str, params: dict[str, Any]) -> tuple[str, Ack | None]:
        node = record.request.target
        directive = directive_for(
            record,
            "gpu_reset",
            suffix=f"gpu_reset{suffix}",
            node=node,
            deadline_s=self.deadline_s,
            params=params,
        )
        return directive.id, await ask_node(self._send, self._acks, directive, self.deadline_s)

    async def _reset(self, record: ActionRecord) -> dict[str, Any]:
        node = record.request.target
        gpu = self._gpu(record)
        detail: dict[str, Any] = {"node": node, "gpu": gpu}
        attempts: list[dict[str, Any]] = []
        detail["attempts"] = attempts
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.retry_s
        delay = self.retry_backoff_s
        while True:
            n = len(attempts) + 1
            asked = time.time()
            directive_id, ack = await self._ask(record, "" if n == 1 else f"-{n}", gpu)
            detail["directive_id"] = directive_id
            attempt: dict[str, Any] = {"n": n, "ts": asked, "answered": ack is not None}
            if ack is not None:
                attempt.update(ok=ack.ok, reason=ack.reason)
            attempts.append(attempt)
            if ack is not None and ack.ok:
                detail.update(answered=True, ok=True, agent_reason=ack.reason)
                return detail
            refused = ack is not None and ack.reason.lower().startswith("refused")
            if ack is not None and refused and loop.time() + delay <= give_up:
                log.info("gpu_reset_refused_retrying", node=node, attempt=n, delay_s=delay, reason=ack.reason)
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_BACKOFF_S)
                continue
            break
        detail.update(answered=ack is not None, ok=False)
        if ack is None:
            why = f"no answer from the agent on {node} within {self.deadline_s:g}s"
        else:
            detail["agent_reason"] = ack.reason
            detail["refused"] = refused
            why = f"agent on {node}: {ack.reason or 'reset failed'}"
            if refused:
                why += f" (still after {n} tries over {self.retry_s:g}s)"
        detail["error"] = why
        return {**detail, **await self._escalate(record, why)}

    async def _escalate(self, record: ActionRecord, why: str) -> dict[str, Any]:
        node = record.request.target
        if self._scheduler is None:
            return {"state": str(ActionState.FAILED), "escalation": None}
        what = record.request.params.get("uuid") or record.request.params.get("pci") or "gpu"
        out: dict[str, Any] = {"state": str(ActionState.ESCALATED)}
        try:
            await self._scheduler.reboot(node, f"ftd: gpu reset of {what} not done, rebooting: {why}")
            out.update(escalation="reboot", reboot_requested_at=time.time())
            log.warning("gpu_reset_escalated_reboot", node=node, gpu=what, why=why)
            return out
        except SchedulerError as exc:
            out["reboot_error"] = str(exc)
        await self._drain(node, f"ftd: gpu {what} reset not done, reboot impossible: RMA ({why})")
        out["escalation"] = "drain"
        log.warning(
            "gpu_reset_escalated_drain", node=node, gpu=what, why=why, reboot_error=out["reboot_error"]
        )
        return out

    async def _drain(self, node: str, reason: str) -> None:
        assert self._scheduler is not None
        await self._scheduler.drain(node, reason)
        if self._state is not None:
            self._state.mark_drained(node, reason)

    async def _verify(self, record: ActionRecord) -> dict[str, Any]:
        if record.detail.get("escalation") != "reboot":
            return {}
        node = record.request.target
        asked_at = float(record.detail.get("reboot_requested_at") or 0.0)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.reboot_deadline_s
        while not self._back_after(node, asked_at):
            if loop.time() >= deadline:
                log.warning("gpu_reset_reboot_unconfirmed", node=node, waited_s=self.reboot_deadline_s)
                return {"reboot_unconfirmed": True}
            await asyncio.sleep(self.reboot_poll_s)
        directive_id, ack = await self._ask(record, "-check", {**self._gpu(record), "check_only": True})
        detail: dict[str, Any] = {
            "check_directive_id": directive_id,
            "check_reason": ack.reason if ack else None,
        }
        if ack is not None and ack.ok:
            detail["reboot_cleared"] = True
            return detail
        what = record.request.params.get("uuid") or record.request.params.get("pci") or "gpu"
        reason = f"ftd: gpu {what} still bad after reboot: RMA ({ack.reason if ack else 'no answer'})"
        await self._drain(node, reason)
        detail.update(reboot_cleared=False, escalation="reboot+drain")
        return detail

    def _back_after(self, node: str, asked_at: float) -> bool:
        """True once the node's agent said ``online`` after ``asked_at`` (it restarted: rebooted)."""
        record = self._state.nodes.get(node) if self._state is not None else None
        return record is not None and record.online and (record.last_change or 0.0) > asked_at
