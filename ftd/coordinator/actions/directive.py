"""Talking to agents: build a directive, send it (retrying while the bus is down), await the answer.

Every executor that asks something of an agent does the same steps, written here once:

* :func:`directive_for` builds the :class:`~ftd.events.Directive` of an action record. Directive ids
  derive from the action id (``{action id}-{suffix}``), so a resumed action re-sends the *same*
  directive and an answer that came before a restart is still accepted.
* A node directive (``gpu_reset``, ``collect_diagnostics``, ``preflight``) goes through a
  :data:`NodeSend`: the coordinator's sender is told the node with the directive (it remembers which
  node may answer it) instead of decoding the payload it was handed to find out. :func:`node_sender`
  is the plain one over a publish function (tests, tools).
* :func:`ask_node` sends a node directive and waits, up to its deadline, for the agent's node-level
  :class:`~ftd.events.Ack` (``rank = -1``, :data:`~ftd.events.NODE_RANK`).
* :func:`publish_with_retry` also carries job directives (one per node the job runs on).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ftd.bus import topics
from ftd.bus.base import BusUnavailable
from ftd.coordinator.actions.acks import AckBook
from ftd.events import NODE_RANK, Ack, Directive, DirectiveAction, encode
from ftd.plugin.actions import ActionRecord

Publish = Callable[[str, bytes], Awaitable[None]]
#: Send a node directive to ``node`` (the node is passed along, never read back from the payload).
NodeSend = Callable[[str, Directive], Awaitable[None]]


def directive_for(
    record: ActionRecord,
    action: DirectiveAction,
    *,
    suffix: str | None = None,
    job: str | None = None,
    node: str | None = None,
    deadline_s: float | None = None,
    params: dict[str, Any] | None = None,
) -> Directive:
    """The directive ``record`` sends: id ``{record.id}-{suffix or action}``, the action's reason."""
    return Directive(
        id=f"{record.id}-{suffix or action}",
        ts=time.time(),
        action=action,
        job=job,
        node=node,
        reason=record.request.reason,
        deadline_s=deadline_s,
        action_id=record.id,
        params=params or {},
    )


def node_sender(publish: Publish) -> NodeSend:
    """A :data:`NodeSend` that publishes to ``ftd/v1/nodes/{node}/directives`` and nothing more."""

    async def send(node: str, directive: Directive) -> None:
        await publish(topics.node_directives(node), encode(directive))

    return send


async def with_retry(attempt: Callable[[], Awaitable[None]], timeout: float) -> None:
    """Run ``attempt``, again while the bus is down, for at most ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    delay = 0.05
    while True:
        try:
            await attempt()
            return
        except BusUnavailable:
            if loop.time() + delay > deadline:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)


async def publish_with_retry(publish: Publish, topic: str, payload: bytes, timeout: float) -> None:
    """Publish, retrying while the bus is down, for at most ``timeout`` seconds."""
    await with_retry(lambda: publish(topic, payload), timeout)


async def ask_node(send: NodeSend, acks: AckBook, directive: Directive, deadline_s: float) -> Ack | None:
    """Send ``directive`` to its node and return the agent's answer (ok or not); None on silence."""
    node = directive.node
    if node is None:
        raise ValueError(f"directive {directive.id} names no node")
    await with_retry(lambda: send(node, directive), deadline_s)
    outcome = await acks.wait(directive.id, [NODE_RANK], deadline_s)
    return outcome.acked.get(NODE_RANK) or outcome.nacked.get(NODE_RANK)


class SentDirectives:
    """The coordinator's :data:`NodeSend`: publishes a node directive and remembers the node it went to,
    so that its answer (an ack of rank NODE_RANK) counts only from that node. Directive ids derive from
    action ids, which a node sees in its own directives, so another node could guess them."""

    MAX_REMEMBERED = 10_000  # node directives remembered for checking who answers them

    def __init__(self, publish: Publish) -> None:
        self._publish = publish
        self._nodes: dict[str, str] = {}  # directive id -> the node it was sent to

    async def send(self, node: str, directive: Directive) -> None:
        self._nodes[directive.id] = node
        if len(self._nodes) > self.MAX_REMEMBERED:
            del self._nodes[next(iter(self._nodes))]
        await self._publish(topics.node_directives(node), encode(directive))

    def node_of(self, directive_id: str) -> str | None:
        """The node a node directive was sent to (None: not one of ours, or forgotten)."""
        return self._nodes.get(directive_id)
