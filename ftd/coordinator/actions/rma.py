"""The ``rma_bundle`` executor: a node drained for repair gets its diagnostic bundle (issue #36 item 5).

A ``rma_bundle`` node directive asks the node's agent to collect :mod:`ftd.agent.rma.bundle`
(``nvidia-bug-report.sh``, the kernel log window, NVML state, ftd's evidence); it sends along the
drain's reason and the node's recent faults as ``evidence``, and ``coordinator.rma``'s kernel-log
window and bug-report deadline. The agent answers with the bundle's path (the Ack's ``path``); the
action's detail keeps it (``bundle``) with the drain action it belongs to (``drain_action``), so the
API's action list links the drain to its bundle. Failed on no answer by the deadline; escalated when
the agent could not write it.

Which drains are "for repair": :func:`is_repair_drain` (the reason holds one of
``coordinator.rma.reasons``, by default ``RMA`` and ``repair``; ftd's own return to service drains
with ``RMA: ...`` and ``params["rma"] = true``).
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any

from ftd.coordinator.actions.acks import AckBook
from ftd.coordinator.actions.directive import NodeSend, ask_node, directive_for
from ftd.coordinator.model.state import ClusterState
from ftd.plugin.actions import ActionRecord, ActionState

RMA_BUNDLE = "rma_bundle"
_ISO = "%Y-%m-%dT%H:%M:%SZ"


def is_repair_drain(reason: str, params: dict[str, Any], reasons: Collection[str]) -> bool:
    """A drain for repair: ``params["rma"]`` is true, or its reason holds one of ``reasons``
    (case-insensitive)."""
    if params.get("rma") is True:
        return True
    low = reason.lower()
    return any(r.lower() in low for r in reasons if r)


class RmaBundle:
    """See the module docstring."""

    def __init__(
        self,
        *,
        send: NodeSend,
        acks: AckBook,
        deadline_s: float,
        kmsg_window_s: float,
        bug_report_timeout_s: float,
        state: ClusterState | None = None,
    ) -> None:
        self._send = send
        self._acks = acks
        self.deadline_s = deadline_s
        self._kmsg_window_s = kmsg_window_s
        self._bug_report_timeout_s = bug_report_timeout_s
        self._state = state

    def _evidence(self, node: str) -> dict[str, Any]:
        if self._state is None:
            return {}
        faults = list(self._state.node_history(node))[-20:]
        return {
            "faults": [
                {
                    "kind": str(f.kind),
                    "code": f.code,
                    "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(f.ts)),
                }
                for f in faults
            ]
        }

    async def __call__(self, record: ActionRecord) -> dict[str, Any]:
        node = record.request.target
        drain = record.request.params.get("drain_action")
        params = {
            "reason": record.request.reason,
            "evidence": self._evidence(node),
            "kmsg_window_s": self._kmsg_window_s,
            "bug_report_timeout_s": self._bug_report_timeout_s,
        }
        directive = directive_for(record, "rma_bundle", node=node, deadline_s=self.deadline_s, params=params)
        ack = await ask_node(self._send, self._acks, directive, self.deadline_s)
        if ack is None:
            return {
                "state": str(ActionState.FAILED),
                "drain_action": drain,
                "rma_bundle": f"no answer from {node}'s agent within {self.deadline_s:g} s",
            }
        detail: dict[str, Any] = {"drain_action": drain, "bundle": ack.path, "rma_bundle": ack.reason}
        if not ack.ok:
            detail["state"] = str(ActionState.ESCALATED)
        return detail


__all__ = ["RMA_BUNDLE", "RmaBundle", "is_repair_drain"]
