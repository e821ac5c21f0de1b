"""Retained first: a starting coordinator handles the retained node status and job presence before
the events its persistent session queued while it was down.

Why: a broker sends a persistent session's queued messages as soon as the client connects, and the
retained messages only once it subscribes again. Handled in arrival order, an Xid queued for a
restarting coordinator was decided before it knew which job ran on the node: the node was drained
and the job was neither saved nor requeued
(``tests/contract/test_coordinator_restart_order.py``, on a real Mosquitto).

How: once subscribed, the coordinator publishes a marker carrying a token of this run to
``ftd/v1/coordinator/sync``, a topic it subscribes to itself. A broker handles one client's packets
in order, so the marker comes back after the retained messages its subscriptions brought. Until
then :meth:`RetainedFirst.settle` handles retained messages as they come and holds the others; the
marker releases the held ones, in their order. A marker with another token (a previous run's, queued
in the session) is only acknowledged. A broker whose ACL does not let the coordinator write the
topic drops the marker: after :data:`SYNC_TIMEOUT_S` the held messages are released anyway and a
warning names the ACL line to add.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable

from ftd.bus import topics
from ftd.bus.base import Message
from ftd.logs import get_logger

log = get_logger(__name__)

SYNC_TIMEOUT_S = 5.0  # a broker that drops the marker (old ACL): go on without it after this long

Take = Callable[[Message], Awaitable[None]]


class RetainedFirst:
    """The start-up ordering of one coordinator run (see the module docstring)."""

    def __init__(self, timeout_s: float = SYNC_TIMEOUT_S) -> None:
        self.token = secrets.token_hex(16).encode()
        self.timeout_s = timeout_s
        self.settled = asyncio.Event()  # set once the held messages were handled
        self.held = 0  # messages held back until the marker (this run)
        self.stale_markers = 0  # markers of earlier runs, acknowledged and dropped
        self.timed_out = False

    @staticmethod
    def is_marker(message: Message) -> bool:
        return message.topic == topics.COORDINATOR_SYNC

    def is_mine(self, message: Message) -> bool:
        return self.is_marker(message) and message.payload == self.token

    async def settle(
        self, messages: AsyncIterator[Message], take: Take, ack: Callable[[Message], None]
    ) -> asyncio.Future[Message] | None:
        """Read ``messages`` until this run's marker (or the timeout): ``take`` the retained ones at
        once, hold the others and ``take`` them after, in order; ``ack`` every marker. Returns the
        read still waiting for its message when the timeout struck (the caller takes its message
        next), else None."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        held: list[Message] = []
        reading: asyncio.Future[Message] | None = None
        try:
            while True:
                if reading is None:
                    reading = asyncio.ensure_future(anext(messages))
                done, _ = await asyncio.wait({reading}, timeout=max(0.0, deadline - loop.time()))
                if not done:  # keep the read: cancelling it would end the caller's iterator
                    self.timed_out = True
                    log.warning(
                        "retained_sync_marker_missing",
                        waited_s=self.timeout_s,
                        held=len(held),
                        consequence="queued events handled without waiting for the retained state",
                        fix=f"let the coordinator's broker user write {topics.COORDINATOR_SYNC}",
                    )
                    break
                message, reading = reading.result(), None
                if self.is_marker(message):
                    ack(message)
                    if message.payload == self.token:
                        log.info("retained_state_received", held=len(held))
                        break
                    self.stale_markers += 1
                elif message.retain:
                    await take(message)
                else:
                    held.append(message)
                    self.held += 1
        except BaseException:
            if reading is not None:
                reading.cancel()
            raise
        for message in held:
            await take(message)
        self.settled.set()
        return reading
