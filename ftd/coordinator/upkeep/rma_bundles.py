"""A node drained for repair gets its diagnostic bundle collected (issue #36 item 5).

What: :class:`RmaBundles`, an engine observer (:meth:`~ftd.coordinator.decide.engine.Engine.observe`):
when a ``drain_node`` for repair succeeds (:func:`~ftd.coordinator.actions.rma.is_repair_drain`: ftd's
own RMA drains, or a reason holding one of ``coordinator.rma.reasons``), it submits one
``rma_bundle`` action for the node, with the drain's action id in ``params["drain_action"]`` and the
drain's reason as its own. The executor (:class:`~ftd.coordinator.actions.rma.RmaBundle`) asks the
agent and keeps the bundle's path in the action's detail beside the drain's id. One bundle per drain.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from ftd.coordinator.actions.rma import RMA_BUNDLE, is_repair_drain
from ftd.logs import get_logger
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState

__all__ = ["RmaBundles"]

log = get_logger(__name__)
RULE = "rma_bundle"


class RmaBundles:
    """See the module docstring."""

    def __init__(
        self, submit: Callable[[ActionRequest], Awaitable[ActionRecord]], *, reasons: Collection[str]
    ) -> None:
        self._submit = submit
        self.reasons = tuple(reasons)
        self._asked: OrderedDict[str, None] = OrderedDict()  # drain action ids already bundled
        self._tasks: set[asyncio.Task[None]] = set()

    def observe(self, what: str, payload: Any) -> None:
        if what != "action" or not isinstance(payload, ActionRecord):
            return
        record = payload
        request = record.request
        if request.kind != ActionKind.DRAIN_NODE or record.state != ActionState.SUCCEEDED:
            return
        if record.id in self._asked or not is_repair_drain(request.reason, request.params, self.reasons):
            return
        self._asked[record.id] = None
        while len(self._asked) > 4096:
            self._asked.popitem(last=False)
        bundle = ActionRequest(
            kind=RMA_BUNDLE,
            target=request.target,
            reason=request.reason,
            params={"drain_action": record.id},
            rule=RULE,
        )

        async def go() -> None:
            done = await self._submit(bundle)
            log.info("rma_bundle_asked", node=request.target, drain_action=record.id, action_id=done.id)

        task = asyncio.get_running_loop().create_task(go(), name="rma-bundle")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settle(self) -> None:
        """Wait for the submissions so far (tests)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
