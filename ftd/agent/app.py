"""The node agent: watchers -> outbox -> bus, and bus directives -> local API -> trainers.

One asyncio process per node. Its MQTT session is its heartbeat: the retained ``online`` status is
published on every connect and the broker publishes the Last Will ``offline`` if the agent dies.
A clean shutdown publishes ``offline`` itself. Everything outbound goes through the :class:`Outbox`
(ordered, bounded, retried until acknowledged), so a broker outage delays events but loses none.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ftd import __version__
from ftd.agent.local_api import LocalApi
from ftd.agent.spool import Outbox, Outgoing
from ftd.agent.watchers.kmsg import KmsgWatcher
from ftd.bus import topics
from ftd.bus.base import Bus, LastWill, Message
from ftd.config import AgentConfig
from ftd.events import Ack, DecodeError, Directive, Event, JobPresence, NodeStatus, RankInfo, decode, encode
from ftd.logs import get_logger
from ftd.sdnotify import notify, watchdog_interval_s

log = get_logger(__name__)


def status_messages(node: str) -> tuple[LastWill, Message]:
    """The Last Will (offline) and birth (online) messages for ``node``'s MQTT session."""
    topic = topics.node_status(node)
    offline = encode(NodeStatus(node=node, state="offline", agent_version=__version__))
    online = encode(NodeStatus(node=node, state="online", ts=time.time(), agent_version=__version__))
    return LastWill(topic, offline, retain=True), Message(topic, online, retain=True)


class Agent:
    def __init__(self, cfg: AgentConfig, *, bus: Bus, node: str | None = None) -> None:
        self.cfg = cfg
        self.node = node or cfg.resolved_node()
        self.bus = bus
        self.outbox = Outbox(bus, max_entries=cfg.outbox_max)
        self.local_api = LocalApi(
            cfg.socket_path, self.node, on_presence=self._on_presence, on_ack=self._on_ack
        )
        state_dir = Path(cfg.state_dir)
        self.kmsg = KmsgWatcher(
            cfg.kmsg_path,
            self.node,
            self.emit,
            state_path=state_dir / "kmsg.position",
            from_start=cfg.kmsg_from_start,
        )
        self.bad_messages = 0
        self.events_emitted = 0
        self._tasks: list[asyncio.Task[Any]] = []

    # --- outbound ------------------------------------------------------------------------------

    async def emit(self, event: Event) -> None:
        """Queue an event for the bus (called by watchers)."""
        self.events_emitted += 1
        self.outbox.put(
            Outgoing(topics.node_event(self.node, event.kind), encode(event), priority=event.severity.rank)
        )
        log.info(
            "event",
            kind=str(event.kind),
            severity=str(event.severity),
            id=event.id,
            code=event.data.get("code"),
            pci=event.data.get("pci"),
            count=event.count,
        )

    async def _on_presence(self, job: str, ranks: list[RankInfo]) -> None:
        topic = topics.node_job(self.node, job)
        payload = encode(JobPresence(job=job, node=self.node, ranks=ranks, ts=time.time())) if ranks else b""
        self.outbox.put(Outgoing(topic, payload, retain=True, priority=3))

    async def _on_ack(self, ack: Ack) -> None:
        self.outbox.put(Outgoing(topics.node_acks(self.node), encode(ack), priority=3))

    # --- inbound -------------------------------------------------------------------------------

    async def _pump_directives(self) -> None:
        async for message in self.bus.messages():
            try:
                directive = decode(message.payload, Directive)
            except DecodeError as exc:
                self.bad_messages += 1
                log.warning("bad directive ignored", topic=message.topic, error=str(exc)[:300])
                continue
            if directive.job is not None:
                if directive.job not in self.local_api.jobs():
                    continue  # a job this node does not host
                reached = await self.local_api.deliver(directive)
                log.info(
                    "directive relayed",
                    action=directive.action,
                    job=directive.job,
                    ranks=reached,
                    directive_id=directive.id,
                )
            else:
                log.warning("node directive not supported by this agent yet", action=directive.action)

    # --- lifecycle -----------------------------------------------------------------------------

    async def run(self, ready: Callable[[], None] | None = None) -> None:
        await self.local_api.start()
        await self.bus.subscribe(topics.ALL_JOB_DIRECTIVES)
        await self.bus.subscribe(topics.node_directives(self.node))
        await self.bus.start()
        self._tasks = [
            asyncio.create_task(self.outbox.run(), name="outbox"),
            asyncio.create_task(self._pump_directives(), name="directives"),
            asyncio.create_task(self.kmsg.run(), name="kmsg"),
            asyncio.create_task(self._watchdog(), name="watchdog"),
        ]
        notify("READY=1")
        log.info("agent started", node=self.node, kmsg=self.cfg.kmsg_path, socket=self.cfg.socket_path)
        if ready is not None:
            ready()
        try:
            done, _ = await asyncio.wait(self._tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()  # a crashed task ends the agent loudly; systemd restarts it
        finally:
            await self.close()

    async def _watchdog(self) -> None:
        interval = watchdog_interval_s()
        if interval is None:
            return
        while True:
            notify("WATCHDOG=1")
            await asyncio.sleep(interval)

    async def close(self, flush_s: float = 2.0) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            if task.get_name() != "outbox":
                task.cancel()
        await self.local_api.stop()
        will, _ = status_messages(self.node)
        offline = encode(
            NodeStatus(node=self.node, state="offline", ts=time.time(), agent_version=__version__)
        )
        self.outbox.put(Outgoing(will.topic, offline, retain=True, priority=3))
        await self.outbox.flush(flush_s)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.bus.stop()
