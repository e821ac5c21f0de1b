"""Talking to agents: publish a directive (retrying while the bus is down), await a node's answer.

Every executor that asks something of an agent does the same two steps: publish a
:class:`~ftd.events.Directive` to ``ftd/v1/nodes/{node}/directives`` and wait, up to its deadline,
for the agent's node-level :class:`~ftd.events.Ack` (``rank = -1``, :data:`~ftd.events.NODE_RANK`).
They live here once: :func:`publish_with_retry` (also used for job directives) and
:func:`ask_node`. Directive ids derive from the action id (the callers' choice), so a resumed
action re-sends the *same* directive and an answer that came before a restart is still accepted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ftd.bus import topics
from ftd.bus.base import BusUnavailable
from ftd.coordinator.actions.acks import AckBook
from ftd.events import NODE_RANK, Ack, Directive, encode

Publish = Callable[[str, bytes], Awaitable[None]]


async def publish_with_retry(publish: Publish, topic: str, payload: bytes, timeout: float) -> None:
    """Publish, retrying while the bus is down, for at most ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    delay = 0.05
    while True:
        try:
            await publish(topic, payload)
            return
        except BusUnavailable:
            if loop.time() + delay > deadline:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)


async def ask_node(publish: Publish, acks: AckBook, directive: Directive, deadline_s: float) -> Ack | None:
    """Send ``directive`` to its node and return the agent's answer (ok or not); None on silence."""
    if directive.node is None:
        raise ValueError(f"directive {directive.id} names no node")
    await publish_with_retry(publish, topics.node_directives(directive.node), encode(directive), deadline_s)
    outcome = await acks.wait(directive.id, [NODE_RANK], deadline_s)
    return outcome.acked.get(NODE_RANK) or outcome.nacked.get(NODE_RANK)
