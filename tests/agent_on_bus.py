"""One agent built by the real wiring, run on an in-memory bus, with the events of some kinds it
publishes collected as a coordinator would receive them (each with its arrival time).

Why here: the door, fabric watcher and job-path tests each ran the same dozen lines (a subscriber,
a collector task, the agent's task, and their teardown); one helper keeps the teardown right.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from ftd.agent.app import Agent
from ftd.agent.wiring import build_agent
from ftd.bus import topics
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import AgentConfig
from ftd.events import Event, Kind, decode


@dataclass
class RunningAgent:
    agent: Agent
    received: list[tuple[float, Event]] = field(default_factory=list)  # (time.monotonic(), event)

    @property
    def events(self) -> list[Event]:
        return [event for _, event in self.received]


@contextlib.asynccontextmanager
async def agent_on_bus(
    cfg: AgentConfig, kinds: Iterable[Kind], node: str = "n1", **build: Any
) -> AsyncIterator[RunningAgent]:
    """``build_agent(cfg, ...)`` running on a fresh in-memory broker, its ``kinds`` of ``node``'s
    events collected; everything stopped (agent closed, subscriber stopped) on the way out."""
    broker = MemoryBroker()
    sub = MemoryBus(broker, client_id="coordinator")
    for kind in kinds:
        await sub.subscribe(topics.node_event(node, str(kind)))
    await sub.start()
    agent = build_agent(cfg, bus=MemoryBus(broker, client_id="agent"), node=node, **build)
    running = RunningAgent(agent)

    async def collect() -> None:
        async for message in sub.messages():
            running.received.append((time.monotonic(), decode(message.payload, Event)))

    collector = asyncio.create_task(collect())
    task = asyncio.create_task(agent.run())
    try:
        yield running
    finally:
        task.cancel()
        collector.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        with contextlib.suppress(asyncio.CancelledError):
            await collector
        await agent.close()
        await sub.stop()
