"""The coordinator daemon: subscribes to the bus, keeps cluster state, runs the engine.

Delivery (DESIGN §11): the coordinator's bus acknowledges a message to the broker only after it was
handled, i.e. after the events in it were committed to the ledger (``manual_ack``); a coordinator
killed before that gets the message again from its persistent session. For every event it has
committed (or had already: duplicates too) it then publishes a :class:`~ftd.events.Receipt` to
``ftd/v1/nodes/{node}/receipts``; the agent keeps an event in its spool until that receipt arrives,
so neither a broker that loses its queue nor a coordinator that dies loses an event. Events it will
never accept (a payload naming another node) are receipted as ``rejected`` with the reason.
A storage error while committing leaves the message unacknowledged (redelivered later) and is
counted; any other failure handling a message is counted as a bad message and never fatal.

Inputs (all decoded strictly; a payload that fails is counted in ``bad_messages`` and logged,
never fatal): node events, retained node status (an ``offline`` from the Last Will becomes a
``node_offline`` event), retained job presence, and trainer acks. A payload whose ``node`` differs
from the node in its topic is rejected: the broker's ACL vouches for the topic, not the payload.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Callable, Mapping
from typing import Any

from ftd import __version__
from ftd.bus import topics
from ftd.bus.base import Bus, BusUnavailable, LastWill, Message
from ftd.config import Config
from ftd.coordinator.acks import AckBook
from ftd.coordinator.actions import BuiltinExecutors, ExecutorContext
from ftd.coordinator.actions.scheduler import Scheduler
from ftd.coordinator.engine import Engine
from ftd.coordinator.ledger import Ledger
from ftd.coordinator.plugins import collect_executors, make_plugin_manager
from ftd.coordinator.policy import PolicyGate
from ftd.coordinator.state import ClusterState
from ftd.events import (
    SCHEMA_VERSION,
    Ack,
    CoordinatorStatus,
    DecodeError,
    Event,
    JobPresence,
    Kind,
    NodeState,
    NodeStatus,
    Receipt,
    Severity,
    decode,
    encode,
)
from ftd.logs import get_logger
from ftd.sdnotify import notify, watchdog_interval_s

log = get_logger(__name__)


MAX_BATCH_BYTES = 4 << 20  # a batched event message larger than this is rejected unread

SUBSCRIPTIONS = (topics.ALL_NODE_STATUS, topics.ALL_NODE_JOBS, topics.ALL_NODE_ACKS, topics.ALL_NODE_EVENTS)


def coordinator_status(state: NodeState) -> bytes:
    return encode(CoordinatorStatus(state=state, ts=time.time(), version=__version__))


def coordinator_will() -> LastWill:
    return LastWill(topics.COORDINATOR_STATUS, coordinator_status("offline"), retain=True)


def make_scheduler(config: Config) -> Scheduler | None:
    cfg = config.coordinator
    if cfg.scheduler == "kubernetes":
        from ftd.coordinator.actions.kubernetes import KubernetesScheduler

        return KubernetesScheduler.from_config(cfg.kubernetes)
    if cfg.scheduler == "none" or not cfg.slurm.enabled:
        return None
    from ftd.coordinator.actions.slurm import SlurmScheduler

    return SlurmScheduler(
        scontrol=cfg.slurm.scontrol, slurm_conf=cfg.slurm.slurm_conf, timeout_s=cfg.slurm.timeout_s
    )


class Coordinator:
    def __init__(
        self,
        config: Config,
        *,
        bus: Bus,
        scheduler: Scheduler | None,
        ledger: Ledger | None = None,
        extra_plugins: tuple[object, ...] = (),
    ) -> None:
        cfg = config.coordinator
        self.config = config
        self.bus = bus
        self.scheduler = scheduler
        self.state = ClusterState()
        self.acks = AckBook()
        self.ledger = ledger or Ledger(cfg.ledger_path)
        self.bad_messages = 0
        self.storage_errors = 0  # messages left unacknowledged because the ledger could not commit
        self.receipts_sent = 0
        self._receipts: dict[str, Receipt] = {}  # node -> what to tell it next
        self._receipts_ready = asyncio.Event()
        builtin = BuiltinExecutors(
            ExecutorContext(
                config=config, state=self.state, acks=self.acks, publish=self._publish, scheduler=scheduler
            )
        )
        plugins = make_plugin_manager(
            disabled=cfg.disabled_rules,
            extra=(builtin, *extra_plugins),
            rule_dirs=cfg.rule_dirs,
            rules_file=cfg.rules_file,
        )
        executors = collect_executors(plugins)
        gate = PolicyGate.from_config(cfg)
        self.engine = Engine(
            state=self.state, ledger=self.ledger, gate=gate, plugins=plugins, executors=executors
        )
        self.engine.startup(self)  # ftd_startup hooks, each on its own
        self._handlers: Mapping[str, Callable[[tuple[str, ...], Message], None]] = {
            "events": self._on_event,
            "status": self._on_status,
            "jobs": self._on_presence,
            "acks": self._on_ack,
        }

    async def _publish(self, topic: str, payload: bytes) -> None:
        await self.bus.publish(topic, payload)

    async def start(self) -> None:
        for pattern in SUBSCRIPTIONS:
            await self.bus.subscribe(pattern)
        await self.bus.start()

    async def _publish_when_connected(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        """Publish, waiting out disconnections (start-up must not die on a transient bus error)."""
        while True:
            try:
                await self.bus.publish(topic, payload, retain=retain)
                return
            except BusUnavailable as exc:
                log.warning("publish_deferred", topic=topic, error=str(exc))
                await self.bus.wait_connected(timeout=1.0)

    async def run(self, ready: Callable[[], None] | None = None) -> None:
        """Process bus messages until cancelled."""
        from ftd.coordinator.api import start_api  # HTTP API + dashboard (None when disabled)

        self.api = await start_api(self)
        await self.start()
        await self.bus.wait_connected()
        # Handle (not just receive) what the broker delivers first -- retained status and job presence,
        # acks it queued for this persistent session while we were down -- before resuming actions that
        # depend on it: a resumed checkpoint_restart must know the job's ranks and see acks sent meanwhile.
        pump = asyncio.create_task(self._pump(), name="bus-messages")
        receipts = asyncio.create_task(self._send_receipts(), name="receipts")
        watchdog: asyncio.Task[None] | None = None
        try:
            await asyncio.sleep(0.5)
            self.engine.resume_unfinished()
            online = Message(topics.COORDINATOR_STATUS, coordinator_status("online"), retain=True)
            self.bus.set_birth(online)  # said again on every reconnect: agents then resend unreceipted events
            await self._publish_when_connected(online.topic, online.payload, retain=True)
            notify("READY=1")
            if ready is not None:
                ready()
            watchdog = asyncio.create_task(self._watchdog())
            await pump
        finally:
            pump.cancel()
            receipts.cancel()
            if watchdog is not None:
                watchdog.cancel()

    async def _pump(self) -> None:
        async for message in self.bus.messages():
            if self.handle_message(message):
                self.bus.ack(message)

    RECEIPT_BATCH_S = 0.02  # receipts gathered this long go out as one message per node

    async def _send_receipts(self) -> None:
        """Publish pending receipts, one message per node, after the events were committed."""
        while True:
            await self._receipts_ready.wait()
            await asyncio.sleep(self.RECEIPT_BATCH_S)
            self._receipts_ready.clear()
            pending, self._receipts = self._receipts, {}
            results = await asyncio.gather(
                *(self.bus.publish(topics.node_receipts(node), encode(r)) for node, r in pending.items()),
                return_exceptions=True,
            )
            for (node, receipt), result in zip(pending.items(), results, strict=True):
                if isinstance(result, BaseException):
                    self._receipt(node, receipt.ids, receipt.rejected)  # try again once reconnected
                    await self.bus.wait_connected(timeout=1.0)
                else:
                    self.receipts_sent += 1

    def _receipt(self, node: str, ids: list[str], rejected: Mapping[str, str] | None = None) -> None:
        current = self._receipts.get(node)
        self._receipts[node] = Receipt(
            node=node,
            ts=time.time(),
            ids=[*(current.ids if current else ()), *ids],
            rejected={**(current.rejected if current else {}), **(rejected or {})},
        )
        self._receipts_ready.set()

    async def _watchdog(self) -> None:
        interval = watchdog_interval_s()
        if interval is None:
            return
        while True:
            notify("WATCHDOG=1")
            await asyncio.sleep(interval)

    async def close(self) -> None:
        api = getattr(self, "api", None)
        if api is not None:
            await api.stop()
        await self.engine.close()
        if self.bus.connected:
            with contextlib.suppress(BusUnavailable):
                await self.bus.publish(topics.COORDINATOR_STATUS, coordinator_status("offline"), retain=True)
        await self.bus.stop()
        self.ledger.close()

    # --- message handling --------------------------------------------------------------------

    def handle_message(self, message: Message) -> bool:
        """Handle one bus message; True when it may be acknowledged to the broker (handled, or bad
        for good), False when it must be delivered again (the ledger could not commit)."""
        try:
            levels = topics.parse(message.topic)
            if len(levels) < 3 or levels[0] != "nodes":
                raise DecodeError("unexpected topic")
            handler = self._handlers.get(levels[2])
            if handler is None:
                raise DecodeError("unexpected topic")
            handler(levels, message)
        except (DecodeError, topics.TopicError, ValueError) as exc:
            self._bad(message, str(exc))
        except (sqlite3.Error, OSError) as exc:
            self.storage_errors += 1
            log.error("ledger_commit_failed", topic=message.topic, error=str(exc), total=self.storage_errors)
            return False
        except Exception as exc:  # no input may crash the coordinator: count it, log it, go on
            self._bad(message, f"{type(exc).__name__}: {exc}")
            log.exception("message_handler_failed", topic=message.topic)
        return True

    def _bad(self, message: Message, why: str) -> None:
        self.bad_messages += 1
        if self.bad_messages <= 20 or self.bad_messages % 1000 == 0:
            log.warning(
                "bad bus message ignored", topic=message.topic, error=why[:300], total=self.bad_messages
            )

    def _on_event(self, levels: tuple[str, ...], message: Message) -> None:
        if levels[3:] == (topics.EVENT_BATCH,):
            # ftd/v1/nodes/{node}/events/batch: a JSON list of Events, all of that node (the ACL
            # vouches for the topic). Checked as a whole before any is handled: one bad event
            # rejects the batch, so a batch is never half-applied.
            batch = decode(message.payload, list[Event], max_bytes=MAX_BATCH_BYTES)
            for event in batch:
                if event.schema != SCHEMA_VERSION:
                    raise DecodeError(f"unsupported schema version {event.schema} in batch")
                if event.node != levels[1]:
                    raise DecodeError(f"event for node {event.node!r} in a batch under node {levels[1]!r}")
            with self.ledger.transaction():  # one commit per batch: the storm's hot path
                for event in batch:
                    self.engine.handle_event(event)
            self._receipt(levels[1], [e.id for e in batch])
            return
        event = decode(message.payload, Event)
        if event.node != levels[1]:
            why = f"event for node {event.node!r} published under node {levels[1]!r}"
            self._receipt(levels[1], [], {event.id: why})
            raise DecodeError(why)
        self.engine.handle_event(event)
        self._receipt(levels[1], [event.id])

    def _on_status(self, levels: tuple[str, ...], message: Message) -> None:
        if not message.payload:
            return
        status = decode(message.payload, NodeStatus)
        if status.node != levels[1]:
            raise DecodeError(f"status for node {status.node!r} published under node {levels[1]!r}")
        changed = self.state.apply_status(status)
        log.info("node status", node=status.node, state=status.state, retained=message.retain)
        if changed and status.state == "offline":
            self.engine.handle_event(
                Event(
                    id=f"{status.node}-offline-{int((status.ts or time.time()) * 1000)}",
                    ts=status.ts or time.time(),
                    node=status.node,
                    kind=Kind.NODE_OFFLINE,
                    severity=Severity.ERROR,
                    source="coordinator",
                    data={"jobs": self.state.jobs_on_node(status.node)},
                )
            )

    def _on_presence(self, levels: tuple[str, ...], message: Message) -> None:
        node, job = levels[1], levels[3]
        presence = decode(message.payload, JobPresence) if message.payload else None
        if presence is not None and (presence.node != node or presence.job != job):
            raise DecodeError("job presence does not match its topic")
        self.state.apply_presence(node, job, presence)

    def _on_ack(self, levels: tuple[str, ...], message: Message) -> None:
        ack = decode(message.payload, Ack)
        if ack.node != levels[1]:
            raise DecodeError(f"ack from node {ack.node!r} published under node {levels[1]!r}")
        log.info(
            "trainer ack", job=ack.job, rank=ack.rank, ok=ack.ok, step=ack.step, directive=ack.directive_id
        )
        self.acks.record(ack)

    def summary(self) -> dict[str, Any]:
        return {
            **self.engine.counters,
            "bad_messages": self.bad_messages,
            "storage_errors": self.storage_errors,
            "receipts_sent": self.receipts_sent,
        }
