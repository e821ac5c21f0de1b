"""The ``preflight`` executor: ask a node's agent to run its preflight checks (``ftd.agent.preflight``).

Used by the return to service (:mod:`ftd.coordinator.upkeep.return_service`): a ``preflight`` node directive
goes to ``ftd/v1/nodes/{node}/directives``; the agent runs the checks and answers with an Ack
(``rank = NODE_RANK``) whose ``ok`` is the verdict and ``reason`` its one line. Succeeded when they
pass, escalated when they fail (the reason in ``detail["preflight"]``), failed on no answer by the
deadline. The directive id derives from the action id: a resumed action asks again with the same
id and the agent answers it from its record instead of running the checks twice.

``refuse`` (issue #36): the coordinator's own reason a node fails whatever its agent answers -- its
version drift when ``coordinator.drift.action = preflight_fail``
(:meth:`~ftd.coordinator.model.inventory.InventoryBook.refuses_preflight`); escalated, both reasons
in ``detail["preflight"]``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ftd.coordinator.actions.acks import AckBook
from ftd.coordinator.actions.directive import NodeSend, ask_node, directive_for
from ftd.plugin.actions import ActionRecord, ActionState

PREFLIGHT = "preflight"


class Preflight:
    """The ``preflight`` executor: ask the node's agent to run its preflight checks; succeeded when
    they pass, escalated when they fail (the reason in ``detail``), failed on no answer."""

    def __init__(
        self,
        *,
        send: NodeSend,
        acks: AckBook,
        deadline_s: float,
        refuse: Callable[[str], str | None] = lambda _node: None,
    ) -> None:
        self._send = send
        self._acks = acks
        self.deadline_s = deadline_s
        self._refuse = refuse

    async def __call__(self, record: ActionRecord) -> dict[str, Any]:
        node = record.request.target
        peer = record.request.params.get("pair_peer")  # {"node", "host", "port"}: a pair test too (#35)
        params = {"pair_peer": peer} if isinstance(peer, dict) else None
        directive = directive_for(record, "preflight", node=node, deadline_s=self.deadline_s, params=params)
        ack = await ask_node(self._send, self._acks, directive, self.deadline_s)
        if ack is None:
            return {
                "state": str(ActionState.FAILED),
                "preflight": f"no answer from {node}'s agent within {self.deadline_s:g} s",
            }
        refused = self._refuse(node)
        if ack.ok and refused:
            why = f"{refused} (the agent's checks passed: {ack.reason})" if ack.reason else refused
            return {"state": str(ActionState.ESCALATED), "passed": False, "preflight": why}
        if ack.ok:
            return {"passed": True, "preflight": ack.reason}
        return {"state": str(ActionState.ESCALATED), "passed": False, "preflight": ack.reason}


__all__ = ["PREFLIGHT", "Preflight"]
