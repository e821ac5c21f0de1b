"""What comes in from the bus: the coordinator's receipts and status, and the directives for this node.

What: :class:`Inbound`. :meth:`~Inbound.pump` (one of the agent's core tasks) reads every message
the agent subscribed to: a receipt lets the outbox forget the events the coordinator took (and those
it rejected); the coordinator coming back ``online`` sends again what it never receipted; a job
directive goes to the local API for the ranks and rank supervisor of a job this node hosts (or one
that names its run, or a ``restart``: both stay pending for who registers later), a node directive to
its handler in :mod:`ftd.agent.node_actions`, run aside as a side task. A message that cannot be
decoded is counted (``bad_messages``) and logged, never fatal. :meth:`~Inbound.resend_overdue`
sends again the events whose receipt is overdue (a lost receipt, a coordinator that lost them).

Why apart from the daemon (:mod:`ftd.agent.app`): the way in mirrors the way out (the one door,
:mod:`ftd.agent.door`); the app only starts both and cancels :attr:`Inbound.side` tasks on close.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from ftd.agent.local_api import LocalApi
from ftd.agent.node_actions import NodeActions
from ftd.agent.spool import Outbox
from ftd.bus import topics
from ftd.bus.base import Bus, Message
from ftd.client.protocol import RUN_PARAM
from ftd.events import CoordinatorStatus, DecodeError, Directive, Receipt, decode
from ftd.logs import get_logger

__all__ = ["Inbound"]

log = get_logger(__name__)


class Inbound:
    """The agent's way in from the bus; see the module docstring."""

    def __init__(
        self,
        node: str,
        *,
        bus: Bus,
        outbox: Outbox,
        local_api: LocalApi,
        node_actions: NodeActions,
        coordinator_online: Callable[[], None] | None = None,
    ) -> None:
        self.node = node
        # called when the coordinator says it is online (a restart, a new leader): the inventory
        # reporter sends its node's inventory again (issue #36)
        self._coordinator_online = coordinator_online
        self._bus = bus
        self._outbox = outbox
        self._local_api = local_api
        self._node_actions = node_actions
        self.bad_messages = 0
        self.side: set[asyncio.Task[None]] = set()  # node directives being handled

    def topics(self) -> list[str]:
        """What the agent subscribes to: only this node's own job directives (the coordinator sends a
        job's directives to each node the scheduler runs it on, and the broker's ACL lets a node read
        no other node's), its node directives and receipts, and the coordinator's status."""
        return [
            topics.node_job_directives(self.node),
            topics.node_directives(self.node),
            topics.node_receipts(self.node),
            topics.COORDINATOR_STATUS,
        ]

    async def pump(self) -> None:
        """Read the bus until cancelled (a core task: the agent ends if it dies)."""
        node_topic = topics.node_directives(self.node)
        jobs_topic = topics.node_job_directives(self.node)
        receipts_topic = topics.node_receipts(self.node)
        async for message in self._bus.messages():
            if message.topic in (receipts_topic, topics.COORDINATOR_STATUS):
                try:
                    if message.topic == receipts_topic:
                        self._on_receipt(message)
                    else:
                        self._on_coordinator_status(message)
                except DecodeError as exc:
                    self.bad_messages += 1
                    log.warning("bad_bus_message_ignored", topic=message.topic, error=str(exc)[:300])
                continue
            try:
                directive = decode(message.payload, Directive)
            except DecodeError as exc:
                self.bad_messages += 1
                log.warning("bad_directive_ignored", topic=message.topic, error=str(exc)[:300])
                continue
            if message.topic == node_topic:
                self._node_directive(directive)
            elif message.topic == jobs_topic and directive.job is not None:
                await self._job_directive(directive)

    async def resend_overdue(self) -> None:
        """Events whose receipt is overdue go out again (a lost receipt, a coordinator that lost them)."""
        outbox = self._outbox
        period = max(0.5, outbox.receipt_timeout_s / 4)
        while True:
            await asyncio.sleep(period)
            resent = outbox.resend_unreceipted(outbox.receipt_timeout_s)
            if resent:
                log.warning("receipts_overdue_resending", events=resent)

    def _on_receipt(self, message: Message) -> None:
        receipt = decode(message.payload, Receipt, max_bytes=16 << 20)
        if receipt.node != self.node:
            raise DecodeError(f"receipt for node {receipt.node!r}")
        self._outbox.receipted(receipt.ids)
        if receipt.rejected:
            self._outbox.rejected(receipt.rejected)

    def _on_coordinator_status(self, message: Message) -> None:
        if not message.payload:
            return
        status = decode(message.payload, CoordinatorStatus)
        if status.state == "online":
            resent = self._outbox.resend_unreceipted()
            if resent:
                log.info("coordinator_online_resending_unreceipted", events=resent)
            if self._coordinator_online is not None:
                self._coordinator_online()

    async def _job_directive(self, directive: Directive) -> None:
        assert directive.job is not None
        if (
            not self._local_api.hosts(directive.job)
            and not directive.params.get(RUN_PARAM)
            and directive.action != "restart"
        ):
            # No rank or rank supervisor (ftd run) of the job here and no run named: a job this node
            # does not host. One that names its run stays pending for that run's ranks (they register
            # again after an agent restart: the broker kept the directive for this session meanwhile);
            # a restart stays pending for the job's supervisor.
            log.info("directive_unknown_job_ignored", job=directive.job, directive_id=directive.id)
            return
        reached = await self._local_api.deliver(directive)
        log.info(
            "directive_relayed",
            action=directive.action,
            job=directive.job,
            ranks=reached,
            directive_id=directive.id,
        )

    def _node_directive(self, directive: Directive) -> None:
        """A directive for the node itself: its handler (:mod:`ftd.agent.node_actions`) runs aside."""
        handler = self._node_actions.handler(directive.action)
        if handler is None:
            log.warning("node_directive_not_supported", action=directive.action, directive_id=directive.id)
            return
        self._spawn(handler(directive), name=f"{directive.action}:{directive.id}")

    def _spawn(self, coro: Coroutine[Any, Any, None], *, name: str) -> None:
        """Run ``coro`` as a side task: kept until done, cancelled when the agent closes."""
        task = asyncio.create_task(coro, name=name)
        self.side.add(task)
        task.add_done_callback(self.side.discard)
