"""The ``burn_in`` executor: ask a drained or new node's agent to run its burn-in (issue #36 item 4).

A ``burn_in`` node directive goes to ``ftd/v1/nodes/{node}/directives``; the agent runs
:mod:`ftd.agent.preflight.burn_in` (refusing while a job runs there), publishes the report as a
``burn_in`` event and answers with an Ack whose ``ok`` is "passed" and ``data["report"]`` the report.
Succeeded when it passed; escalated when it failed, was incomplete (a step skipped) or refused (the
report's reason in ``detail["burn_in"]``, its verdict in ``detail["verdict"]``); failed on no answer by
the deadline. The return to service (:mod:`ftd.coordinator.upkeep.return_service`) runs it after the
preflight when ``coordinator.return_to_service.require_burn_in`` is set.
"""

from __future__ import annotations

from typing import Any

from ftd.coordinator.actions.acks import AckBook
from ftd.coordinator.actions.directive import NodeSend, ask_node, directive_for
from ftd.plugin.actions import ActionRecord, ActionState

BURN_IN = "burn_in"


class BurnIn:
    """See the module docstring."""

    def __init__(self, *, send: NodeSend, acks: AckBook, deadline_s: float) -> None:
        self._send = send
        self._acks = acks
        self.deadline_s = deadline_s

    async def __call__(self, record: ActionRecord) -> dict[str, Any]:
        node = record.request.target
        directive = directive_for(record, "burn_in", node=node, deadline_s=self.deadline_s)
        ack = await ask_node(self._send, self._acks, directive, self.deadline_s)
        if ack is None:
            return {
                "state": str(ActionState.FAILED),
                "burn_in": f"no answer from {node}'s agent within {self.deadline_s:g} s",
            }
        raw = ack.data.get("report")
        report: dict[str, Any] = raw if isinstance(raw, dict) else {}
        verdict = str(report.get("verdict", "passed" if ack.ok else "failed"))
        detail: dict[str, Any] = {
            "passed": ack.ok,
            "burn_in": ack.reason,
            "verdict": verdict,
            "report": report,
        }
        if not ack.ok:
            detail["state"] = str(ActionState.ESCALATED)
        return detail


__all__ = ["BURN_IN", "BurnIn"]
