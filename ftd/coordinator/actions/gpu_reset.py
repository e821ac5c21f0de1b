"""gpu_reset (coordinator side): ask the node's agent to reset one GPU and wait for its answer.

The request's target is the node; ``params`` name the GPU (any of ``pci``, ``uuid``, ``index``; the
agent resolves and cross-checks them). A ``gpu_reset`` :class:`~ftd.events.Directive` goes to
``ftd/v1/nodes/{node}/directives`` with ``deadline_s``; the agent answers on its acks topic with an
:class:`~ftd.events.Ack` for the directive id, ``rank = -1`` (:data:`NODE_RANK`: a node-level answer,
not a trainer's), ``ok`` and a ``reason`` such as ``"refused: processes hold the GPU"`` or
``"reset: healthy after reset"``. The agent refuses while any process holds the GPU (DESIGN §11);
this side only records what it was told.

Outcomes recorded in the action's detail: ``ok`` -> succeeded; ``ok = false`` -> failed with the
agent's reason (``refused`` true when it starts with "refused"); no answer by the deadline -> failed,
``answered = false`` (the outcome on the node is unknown: the agent may still report it as an event).

Idempotent by action id: the directive id is ``{action id}-gpu_reset``, so a resumed action re-sends the
*same* directive (an agent that already handled it answers again from its record instead of resetting
twice) and an answer that arrived before the restart is still accepted.
"""

from __future__ import annotations

import time
from typing import Any

from ftd.coordinator.acks import AckBook
from ftd.coordinator.actions._directive import Publish, ask_node
from ftd.events import Directive
from ftd.plugin.actions import ActionRecord, ActionState

GPU_KEYS = ("pci", "uuid", "index")


class GpuReset:
    def __init__(self, *, publish: Publish, acks: AckBook, deadline_s: float) -> None:
        self._publish = publish
        self._acks = acks
        self.deadline_s = deadline_s

    async def __call__(self, record: ActionRecord) -> dict[str, Any]:
        node = record.request.target
        gpu = {k: record.request.params[k] for k in GPU_KEYS if record.request.params.get(k) is not None}
        if not gpu:
            raise ValueError("gpu_reset needs params.pci, params.uuid or params.index")
        directive = Directive(
            id=f"{record.id}-gpu_reset",
            ts=time.time(),
            action="gpu_reset",
            node=node,
            reason=record.request.reason,
            deadline_s=self.deadline_s,
            action_id=record.id,
            params=gpu,
        )
        detail: dict[str, Any] = {"node": node, "gpu": gpu, "directive_id": directive.id}
        ack = await ask_node(self._publish, self._acks, directive, self.deadline_s)
        if ack is None:
            detail.update(answered=False, state=str(ActionState.FAILED))
            detail["error"] = f"no answer from the agent on {node} within {self.deadline_s:g}s"
            return detail
        detail.update(answered=True, ok=ack.ok, agent_reason=ack.reason)
        if not ack.ok:
            detail["refused"] = ack.reason.lower().startswith("refused")
            detail["state"] = str(ActionState.FAILED)
            detail["error"] = f"agent on {node}: {ack.reason or 'reset failed'}"
        return detail
