"""The coordinator daemon: subscribes to the bus, keeps cluster state, runs the engine.

Delivery (docs/architecture.md §11.1): the coordinator's bus acknowledges a message to the broker only after
it was handled, i.e. after the events in it were committed to the ledger (``manual_ack``); a coordinator
killed before that gets the message again from its persistent session. For every event it has committed (or
had already: duplicates too) it then publishes a :class:`~ftd.events.Receipt` to
``ftd/v1/nodes/{node}/receipts``; the agent keeps an event in its spool until that receipt arrives, so neither
a broker that loses its queue nor a coordinator that dies loses an event. Events it will never accept (a
payload naming another node) are receipted as ``rejected`` with the reason. A storage error while committing
leaves the message unacknowledged (redelivered later) and is counted; any other failure handling a message is
counted as a bad message and never fatal.

Inputs (all decoded strictly; a payload that fails is counted in ``bad_messages`` and logged,
never fatal): node events, retained node status (an ``offline`` from the Last Will or a clean
``stopped`` becomes a ``node_offline`` event only if the node is not back within its grace:
:mod:`ftd.coordinator.intake.offline_grace`; any message from the node ends the wait), retained job
presence, trainer acks, and the state of rack brokers' bridges to the core (a bridge down puts every
node online through that rack in the same grace: :mod:`ftd.coordinator.intake.rack_bridges`). A
payload whose ``node`` differs
from the node in its topic is rejected: the broker's ACL vouches for the topic, not the payload.

Intake (:mod:`ftd.coordinator.intake`): one node cannot crash, stall or starve the coordinator.
Every event message, one event or a batch, goes through one admission pipeline -- size, decode,
identity, placement, fairness (:class:`~ftd.coordinator.intake.admission.Admission`) -- which returns
a verdict; the daemon hands the admitted events to the engine (a batch in chunks of
:data:`~ftd.coordinator.intake.admission.BATCH_CHUNK`, one commit each, yielding to the event loop
between them) and receipts them (:class:`~ftd.coordinator.intake.receipts.ReceiptOutbox`). Every
refused message of a node is counted in ``bad_messages`` and in that node's ``bad_input`` summary;
events over the node's rate are folded into it.

Acknowledgements go out in groups (:meth:`Coordinator._flush`): at most :data:`ACK_EVERY` handled
messages or :data:`ACK_DELAY_S` seconds wait, then the changed summaries are committed (one
transaction for all nodes), the events folded or refused into them receipted, and the messages
acknowledged. So a folded message, too, is acknowledged only after what records it is committed;
and the MQTT client, which registers its socket for writing and sends once per acknowledgement,
does that once per group: acknowledging each message alone made the coordinator fall behind a
10,000 messages/s flood on a two-core machine. The group stays below Mosquitto's
``max_inflight_messages`` (20 by default), past which the broker would stop sending.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sqlite3
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from ftd import __version__
from ftd.bus import topics
from ftd.bus.base import Bus, BusUnavailable, LastWill, Message
from ftd.config import Config
from ftd.coordinator.actions.acks import AckBook
from ftd.coordinator.actions.directive import SentDirectives
from ftd.coordinator.actions.partners import CheckpointPartners
from ftd.coordinator.actions.release import SpareRelease
from ftd.coordinator.actions.scheduler import JobInfo, Scheduler
from ftd.coordinator.actions.slurm import SlurmScheduler
from ftd.coordinator.decide.engine import Engine
from ftd.coordinator.decide.policy import labels_from_config
from ftd.coordinator.intake.admission import BATCH_CHUNK, Admission, Refused, Verdict
from ftd.coordinator.intake.fairness import readable_ids
from ftd.coordinator.intake.grace_watch import GraceWatch, PodGraceWatch
from ftd.coordinator.intake.offline_grace import BRIDGE_DOWN, OfflineGrace, Pending
from ftd.coordinator.intake.placement import NeedPlacement, Placement
from ftd.coordinator.intake.presence_memory import PresenceMemory
from ftd.coordinator.intake.rack_bridges import RackBridges, bridge_up
from ftd.coordinator.intake.receipts import ReceiptOutbox
from ftd.coordinator.intake.scheduler_interruptions import InterruptionPolicy, SchedulerInterruptions
from ftd.coordinator.intake.slow_ranks import SlowRanks
from ftd.coordinator.intake.time_left import JobTimeLeft
from ftd.coordinator.ledger.store import LedgerStore
from ftd.coordinator.model.leadership import HaStatus
from ftd.coordinator.model.state import ClusterState
from ftd.coordinator.upkeep.fabric_tests import FabricTests
from ftd.coordinator.upkeep.reconcile import Reconciler
from ftd.coordinator.upkeep.return_service import ReturnToService
from ftd.events import (
    NODE_RANK,
    Ack,
    CoordinatorStatus,
    DecodeError,
    Event,
    JobPresence,
    Kind,
    NodeConditions,
    NodeState,
    NodeStatus,
    Severity,
    decode,
    encode,
)
from ftd.logs import get_logger
from ftd.sdnotify import notify, ping_watchdog

log = get_logger(__name__)


ACK_EVERY = 10  # handled messages whose acknowledgement waits, at most (Mosquitto allows 20 in flight)
ACK_DELAY_S = 0.002  # ... and for this long at most

#: The collector's thresholds in a coordinator process (CPython's default: 700, 10, 10). The daemon
#: holds a large, long-lived and acyclic picture of the cluster (every node's recent events, per-node
#: buckets and records): with the default, a storm triggered a full collection every few seconds,
#: each a stall of 100-200 ms that every event then waited out (issue #25). A young generation of
#: 10,000 lets the young collections still free the short-lived cycles (asyncio's) every few
#: milliseconds of work, at a pause of a few ms, and makes full collections rare.
COLLECTOR_THRESHOLDS = (10_000, 10, 10)


def tune_collector() -> None:
    """Set :data:`COLLECTOR_THRESHOLDS` (a coordinator process calls it once, before it starts)."""
    gc.set_threshold(*COLLECTOR_THRESHOLDS)


class Service(Protocol):
    """Something the daemon starts after loading its memory and stops on close (the HTTP API)."""

    async def stop(self) -> None: ...


#: Starts a service for a coordinator (None: not configured); the composition root passes them.
StartService = Callable[["Coordinator"], Awaitable[Service | None]]


SUBSCRIPTIONS = (
    topics.ALL_NODE_STATUS,
    topics.ALL_NODE_JOBS,
    topics.ALL_NODE_ACKS,
    topics.ALL_NODE_EVENTS,
    topics.ALL_NODE_CONDITIONS,
    topics.ALL_BRIDGE_STATE,  # last: a restarted coordinator knows the nodes before a rack's retained 0
)


def coordinator_status(state: NodeState) -> bytes:
    return encode(CoordinatorStatus(state=state, ts=time.time(), version=__version__))


def coordinator_will() -> LastWill:
    return LastWill(topics.COORDINATOR_STATUS, coordinator_status("offline"), retain=True)


class Coordinator:
    """The daemon: pumps bus messages through intake, the engine and the receipts; runs the upkeep
    loops. Built by :func:`ftd.coordinator.wiring.build`, which assembles every part it is given."""

    def __init__(
        self,
        config: Config,
        *,
        bus: Bus,
        scheduler: Scheduler | None,
        state: ClusterState,
        acks: AckBook,
        ledger: LedgerStore,
        engine: Engine,
        admission: Admission,
        placement: Placement,
        presence_memory: PresenceMemory,
        directives: SentDirectives,
        reconciler: Reconciler,
        return_to_service: ReturnToService | None = None,
        fabric_tests: FabricTests | None = None,
        services: tuple[StartService, ...] = (),
    ) -> None:
        self.config = config
        self.bus = bus
        self.scheduler = scheduler
        self.state = state
        self.acks = acks
        self.ledger = ledger
        self.engine = engine
        self.admission = admission
        self.limiter = admission.limiter
        self.inputs = admission.inputs
        admission.placement = placement  # one placement check for intake and the daemon (see the property)
        self.presence_memory = presence_memory  # which job runs where, known at start (ledger)
        self.directives = directives
        self.reconciler = reconciler
        self.return_to_service = return_to_service
        self.fabric_tests = fabric_tests  # bisections by pair tests (issue #35; None: disabled)
        self.receipts = ReceiptOutbox(bus)
        self.offline_grace = OfflineGrace(config.coordinator.offline_grace)
        self.time_left = JobTimeLeft(scheduler)  # each job's time before its limit (the cost model)
        announced = config.coordinator.slurm.interruptions
        self.interruptions = SchedulerInterruptions(  # issue #37: preemption, time limit, pod deletion
            # Slurm and the fake announce through job_info and reservations, Kubernetes through the pods
            scheduler if announced.enabled and scheduler is not None else None,
            self.engine.handle_event,
            policy=InterruptionPolicy(
                time_limit_window_s=announced.time_limit_window_s,
                preempt_grace_s=announced.preempt_grace_s,
                kill_wait_s=announced.kill_wait_s,
            ),
            interval_s=announced.interval_s,
            on_running=self._grace_watch(scheduler, config),
            every_job=announced.every_job,
        )
        self.slow_ranks = SlowRanks(
            config.coordinator.slow_ranks,
            node_events=state.node_events,
            remaining_for=self.time_left.remaining,
        )
        self._status_seen: set[str] = set()  # nodes whose status this coordinator has read
        self.rack_bridges = RackBridges()  # which rack broker each node is on, whose bridge is down
        self.spare_release = SpareRelease(bus.publish)  # a finished ftd run job's spares exit
        racks = {n: v["rack"] for n, v in labels_from_config(config.coordinator).items() if "rack" in v}
        self.checkpoint_partners = CheckpointPartners(bus.publish, racks)  # where replicas go (#34)
        self.services = services
        self.api: Service | None = None  # the HTTP API + dashboard, once started (None when disabled)
        self.loaded = False  # the engine's and the reconciler's memory read from the ledger (load())
        self.ha: HaStatus | None = None  # who leads, when run by ha.runner (PostgreSQL ledger)
        self.storage_errors = 0  # messages left unacknowledged because the ledger could not commit
        self._acks: list[Message] = []  # handled, their acknowledgement not sent yet
        self._flush_due = asyncio.Event()
        self._handlers: Mapping[str, Callable[[tuple[str, ...], Message], Awaitable[bool]]] = {
            "status": self._on_status,
            "jobs": self._on_presence,
            "acks": self._on_ack,
            "conditions": self._on_conditions,
        }

    @property
    def placement(self) -> Placement:
        """The placement check, shared with intake: replacing it here replaces it there too."""
        return self.admission.placement

    @placement.setter
    def placement(self, placement: Placement) -> None:
        self.admission.placement = placement

    @property
    def bad_messages(self) -> int:
        """Messages refused (counted by intake): oversized, undecodable, foreign, failed handling."""
        return self.admission.bad_messages

    @bad_messages.setter
    def bad_messages(self, value: int) -> None:
        self.admission.bad_messages = value

    @property
    def receipts_sent(self) -> int:
        return self.receipts.sent

    async def load(self) -> None:
        """Read what the ledger remembers -- the engine's gate, held approvals and history, ftd's
        drains -- then call the ``ftd_startup`` hooks; once, before the first message is handled
        (:meth:`run` calls it; so does the HA runner, before it replays its warm view)."""
        if self.loaded:
            return
        await self.engine.load()
        await self.reconciler.restore()  # ftd's drains before any event is decided
        await self.presence_memory.load()  # and which job runs where (presence_memory)
        self.loaded = True
        self.engine.startup(self)  # ftd_startup hooks, each on its own

    async def _forget_stopped_jobs(self) -> None:
        """Drop the remembered presence of what ended or moved while the coordinator was down (the
        warm-up's answer, or one lookup per remembered job where the scheduler has no bulk call)."""
        running = self.placement.running
        if running is None and self.placement.enforced and self.presence_memory.jobs():
            running = await self.placement.where(self.presence_memory.jobs())
        if running is not None:
            await self.presence_memory.forget_stopped(running.get)

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
        await self.load()
        for start_service in self.services:  # the HTTP API + dashboard (None when disabled)
            self.api = await start_service(self)
        await self.start()
        await self.bus.wait_connected()
        await self.placement.warm()  # every running job's nodes in one call, before the retained presence
        await self._forget_stopped_jobs()
        # Handle (not just receive) what the broker delivers first -- retained status and job presence,
        # acks it queued for this persistent session while we were down -- before resuming actions that
        # depend on it: a resumed checkpoint_restart must know the job's ranks and see acks sent meanwhile.
        pump = asyncio.create_task(self._pump(), name="bus-messages")
        receipts = asyncio.create_task(self.receipts.run(), name="receipts")
        flusher = asyncio.create_task(self._flush_when_due(), name="acks")
        grace = asyncio.create_task(self._offline_when_due(), name="offline-grace")
        announced = asyncio.create_task(self.interruptions.run(), name="scheduler-interruptions")
        watchdog: asyncio.Task[None] | None = None
        reconcile: asyncio.Task[None] | None = None
        mesh: asyncio.Task[None] | None = None
        try:
            await asyncio.sleep(0.5)
            await self.engine.resume_unfinished()
            reconcile = asyncio.create_task(self.reconciler.run(), name="reconcile")
            fabric = self.config.coordinator.fabric
            if self.fabric_tests is not None and fabric.mesh_interval_s > 0:
                mesh = asyncio.create_task(
                    self.fabric_tests.run_mesh(
                        self.directives.send,
                        port=fabric.port,
                        interval_s=fabric.mesh_interval_s,
                        forget=self.acks.forget,
                    ),
                    name="pingmesh",
                )
            online = Message(topics.COORDINATOR_STATUS, coordinator_status("online"), retain=True)
            self.bus.set_birth(online)  # said again on every reconnect: agents then resend unreceipted events
            await self._publish_when_connected(online.topic, online.payload, retain=True)
            notify("READY=1")
            if ready is not None:
                ready()
            watchdog = asyncio.create_task(ping_watchdog())
            await pump
        finally:
            pump.cancel()
            receipts.cancel()
            flusher.cancel()
            grace.cancel()
            announced.cancel()
            if watchdog is not None:
                watchdog.cancel()
            if reconcile is not None:
                reconcile.cancel()
            if mesh is not None:
                mesh.cancel()

    def _grace_watch(
        self, scheduler: Scheduler | None, config: Config
    ) -> Callable[[JobInfo], Awaitable[object]] | None:
        """The grace audit at each job's first look (issue #37 item 5): Slurm's KillWait and GraceTime,
        or the pods' termination grace on Kubernetes; None for a scheduler without either."""
        save_s = config.coordinator.save_deadline_s
        if isinstance(scheduler, SlurmScheduler):
            return GraceWatch(scheduler.grace, save_s, measured=self._slowest_save).job_seen
        pod_grace = getattr(scheduler, "pod_grace", None)
        if pod_grace is not None:
            return PodGraceWatch(pod_grace, save_s, measured=self._slowest_save).job_seen
        return None

    def _slowest_save(self, job: str) -> float | None:
        """The job's measured save time for the grace audit: its slowest level's p95, None before any."""
        return max(self.state.save_times.p95(job).values(), default=None)

    async def _pump(self) -> None:
        """Handle bus messages in order; acknowledge them in groups (see the module docstring)."""
        async for message in self.bus.messages():
            if await self.handle(message):
                self._acks.append(message)
                if len(self._acks) >= ACK_EVERY:
                    await self._flush()
                else:
                    self._flush_due.set()

    RETRY_COMMIT_S = 1.0  # after a storage error, the next try to commit the summaries

    async def _flush_when_due(self) -> None:
        """:meth:`_flush` :data:`ACK_DELAY_S` after a message was handled (the pump flushes sooner,
        after :data:`ACK_EVERY` of them)."""
        while True:
            await self._flush_due.wait()
            await asyncio.sleep(ACK_DELAY_S)
            self._flush_due.clear()
            if not await self._flush():
                await asyncio.sleep(self.RETRY_COMMIT_S)
                self._flush_due.set()

    async def _flush(self) -> bool:
        """Commit the changed summaries, then acknowledge the messages handled since the last flush;
        False (nothing acknowledged, tried again later) when the ledger cannot commit."""
        if (self.inputs.dirty or self.placement.security.dirty) and not await self.commit_summaries():
            return False
        acks, self._acks = self._acks, []
        for message in acks:
            self.bus.ack(message)
        return True

    async def commit_summaries(self) -> bool:
        """Commit every ``bad_input`` summary changed since the last call (one transaction), then
        receipt the events folded or refused into them; False on a storage error (tried again later)."""
        summaries = self.inputs.pending() + self.placement.security.pending()
        if summaries:
            try:
                async with self.ledger.transaction():
                    for summary in summaries:
                        await self.ledger.record_summary(summary)
            except (sqlite3.Error, OSError) as exc:
                self.storage_errors += 1
                log.error("summary_commit_failed", error=str(exc), total=self.storage_errors)
                return False
        self.placement.security.committed()
        done = self.inputs.committed()
        for node, ids in done.folded.items():
            self.receipts.add(node, ids)
        for node, reasons in done.rejected.items():
            self.receipts.add(node, [], reasons)
        return True

    async def close(self) -> None:
        if self.api is not None:
            await self.api.stop()
        await self.engine.close()
        await self.placement.close()
        await self.time_left.close()
        await self._flush()  # what was folded or refused last is in the ledger, not only in memory
        if self.bus.connected:
            with contextlib.suppress(BusUnavailable):
                await self.bus.publish(topics.COORDINATOR_STATUS, coordinator_status("offline"), retain=True)
        await self.bus.stop()
        await self.ledger.close()

    # --- message handling --------------------------------------------------------------------

    async def handle_message(self, message: Message) -> bool:
        """Handle one bus message to the end -- the summaries committed too -- and say whether it may
        be acknowledged to the broker (handled, folded or refused for good; False: deliver it again,
        the ledger could not commit). The bus pump uses :meth:`handle` and commits in groups."""
        ok = await self.handle(message)
        if self.inputs.dirty or self.placement.security.dirty:
            await self.commit_summaries()  # a storage error leaves them pending, as the pump's commits do
        return ok

    async def handle(self, message: Message) -> bool:
        """Handle one bus message, yielding to the event loop between the chunks of a batch; True when
        it may be acknowledged to the broker once the summaries are committed (:meth:`_flush`).

        A message that speaks for a job whose placement is not known yet is handled again after the
        scheduler lookup (handlers raise :class:`NeedPlacement` before any side effect); one the
        scheduler cannot vouch for now is held and retried (:mod:`ftd.coordinator.intake.placement`)."""
        for attempt in (1, 2):
            try:
                return await self._process(message)
            except NeedPlacement as need:
                if attempt == 1 and await self.placement.lookup(need.node, need.jobs):
                    continue
                held = self.placement.hold(message, need.node, need.jobs, self.handle, self._unverified)
                if not held:
                    self._unverified(message)
                return True
        return True

    def _unverified(self, message: Message) -> None:
        """Refuse a message whose job the scheduler could not vouch for (fail closed)."""
        levels = topics.parse(message.topic)
        error = "the scheduler could not say which nodes run this job; refused (fail closed)"
        self._refuse(message, levels[1], "placement_unverified", error)
        self._flush_due.set()

    async def _process(self, message: Message) -> bool:
        """The handling of one message (a batch gives the loop a turn between its chunks)."""
        node: str | None = None  # whose summary a refusal goes into (None: no node to charge)
        events = batch = False  # an event message, a batch of them: its event ids are worth reading
        try:
            levels = topics.parse(message.topic)
            if levels[0] == "bridges":
                return await self._on_bridge_state(levels, message)
            if len(levels) < 3 or levels[0] != "nodes":
                raise DecodeError("unexpected topic")
            node = topics.check_level(levels[1], "node")
            events = levels[2] == "events"
            batch = events and levels[3:] == (topics.EVENT_BATCH,)
            if levels[2] != "status" and not message.retain:  # retained: said before, maybe long ago
                self._node_alive(node, levels[2])
            Admission.check_size(message, events=events, batch=batch)
            if events:
                await self._decide(await self.admission.admit(node, message, batch=batch), batch=batch)
                return True
            handler = self._handlers.get(levels[2])
            if handler is None:
                raise DecodeError("unexpected topic")
            return await handler(levels, message)
        except Refused as refused:
            return self._refuse(message, node, refused.reason, refused.error, refused.ids)
        except NeedPlacement:
            raise  # nothing done yet: handled again once the scheduler said where the job runs
        except (DecodeError, topics.TopicError, ValueError) as exc:
            return self._refuse(message, node, "invalid", str(exc))
        except (sqlite3.Error, OSError) as exc:
            self.storage_errors += 1
            log.error("ledger_commit_failed", topic=message.topic, error=str(exc), total=self.storage_errors)
            return False
        except Exception as exc:  # no input may crash the coordinator: count it, log it, go on
            log.exception("message_handler_failed", topic=message.topic[:200])
            ids = readable_ids(message.payload, batch=batch) if events else []
            return self._refuse(message, node, "error", f"{type(exc).__name__}: {exc}", ids)

    async def _decide(self, verdict: Verdict, *, batch: bool) -> None:
        """Hand the admitted events to the engine and receipt them once committed: a single event
        alone, a batch in chunks of :data:`BATCH_CHUNK` with one commit each (the storm's hot path),
        the loop getting a turn between chunks."""
        node = verdict.node
        if verdict.rejected:
            self.receipts.add(node, [], verdict.rejected)
        admitted = verdict.events
        if not batch:
            for event in admitted:
                await self.engine.handle_event(event)
                self.receipts.add(node, [event.id])
            return
        for start in range(0, len(admitted), BATCH_CHUNK):
            if start:
                await asyncio.sleep(0)
            chunk = admitted[start : start + BATCH_CHUNK]
            await self.engine.handle_events(chunk)
            self.receipts.add(node, [e.id for e in chunk])

    def _refuse(
        self, message: Message, node: str | None, reason: str, error: str, ids: list[str] | None = None
    ) -> bool:
        """Count a refused message (intake's book); True: it may be acknowledged, refused for good."""
        self.admission.refuse(message, node, reason, error, ids)
        return True

    async def _on_status(self, levels: tuple[str, ...], message: Message) -> bool:
        if not message.payload:
            return True
        status = decode(message.payload, NodeStatus)
        if status.node != levels[1]:
            raise DecodeError(f"status for node {status.node!r} published under node {levels[1]!r}")
        self.rack_bridges.seen(status.node, status.rack_broker)
        first = status.node not in self._status_seen
        self._status_seen.add(status.node)
        changed = self.state.apply_status(status)
        log.info("node_status", node=status.node, state=status.state, retained=message.retain)
        dark = self.rack_bridges.down_rack(status.node) if message.retain else None
        if status.state == "online" and dark is not None:
            await self._behind_dead_bridge(dark, [status.node])  # said before its rack went dark
        elif status.state == "online":
            self._node_alive(status.node, "online")
        elif changed or first:
            # gone: a node_offline only if it is not back within its grace (intake/offline_grace.py)
            pending = self.offline_grace.left(status.node, status.state, status.ts)
            log.info(
                "offline_grace_started",
                node=status.node,
                why=pending.why,
                grace_s=pending.grace_s,
                jobs=self.state.jobs_on_node(status.node),
                after_restart=first and message.retain,
            )
            if pending.grace_s <= 0:
                await self._offline_when_due(once=True)
        return True

    async def _on_bridge_state(self, levels: tuple[str, ...], message: Message) -> bool:
        """A rack broker's bridge to the core is up (``1``) or down (``0``: the core fired the bridge's
        Last Will, :mod:`ftd.coordinator.intake.rack_bridges`): down, every node online through
        that rack gets the Last Will's grace; each is back when a live message of its own arrives."""
        if len(levels) != 3 or levels[2] != "state":
            raise DecodeError("unexpected bridges topic")
        rack = topics.check_level(levels[1], "rack broker")
        if not message.payload:
            return True  # a cleared notification: nothing said
        up = bridge_up(message.payload)
        if not self.rack_bridges.went(rack, up):
            return True
        if up:
            away = [
                n for n in self.rack_bridges.nodes_on(rack, self.state.nodes) if self.offline_grace.pending(n)
            ]
            log.info("rack_bridge_up", rack=rack, nodes_still_away=len(away), retained=message.retain)
            return True
        await self._behind_dead_bridge(rack, self.rack_bridges.nodes_on(rack, self.state.online_nodes()))
        return True

    async def _behind_dead_bridge(self, rack: str, nodes: list[str]) -> None:
        """``nodes`` are off the bus with rack ``rack``'s bridge: offline in the state, each pending
        with the Last Will's grace (a node_offline when it ends, unless the node is heard from)."""
        now = time.time()
        for node in nodes:
            self.state.apply_status(NodeStatus(node=node, state="offline", ts=now, rack_broker=rack))
            self.offline_grace.left(node, "offline", why=BRIDGE_DOWN)
        grace_s = self.config.coordinator.offline_grace.last_will_s
        log.warning(
            "rack_bridge_down",
            rack=rack,
            nodes=len(nodes),
            jobs=sum(len(self.state.jobs_on_node(node)) for node in nodes),
            grace_s=grace_s,
            decision="node_offline for each node not heard from within the grace" if nodes else "none",
            first_nodes=nodes[:16],
        )
        if nodes and grace_s <= 0:
            await self._offline_when_due(once=True)

    def _node_alive(self, node: str, evidence: str) -> None:
        """Evidence that ``node`` lives (its ``online`` status, or any live message from it: events,
        acks, job presence; a retained message is not, it may be the dead node's last word): a
        pending offline is cancelled, and logged with what ended it."""
        pending = self.offline_grace.alive(node)
        if pending is not None:
            log.info(
                "offline_grace_cancelled",
                node=node,
                why=pending.why,
                evidence=evidence,
                away_s=round(time.monotonic() - pending.since, 3),
                grace_s=pending.grace_s,
            )

    async def _offline_when_due(self, *, once: bool = False) -> None:
        """Turn each node still gone when its grace ends into a ``node_offline`` event (the rules'
        ``node_death``); checked every half second (or once)."""
        while True:
            for pending in self.offline_grace.due():
                await self._node_offline(pending)
            if once:
                return
            await asyncio.sleep(0.5)

    async def _node_offline(self, pending: Pending) -> None:
        record = self.state.nodes.get(pending.node)
        if record is not None and record.online:
            return  # back in the meantime (its online status was handled first)
        jobs = self.state.jobs_on_node(pending.node)
        away = round(time.monotonic() - pending.since, 3)
        log.warning("node_offline", node=pending.node, why=pending.why, away_s=away, jobs=jobs)
        ts = pending.status_ts or time.time() - away
        await self.engine.handle_event(
            Event(
                id=f"{pending.node}-offline-{int(ts * 1000)}",
                ts=ts,
                node=pending.node,
                kind=Kind.NODE_OFFLINE,
                severity=Severity.ERROR,
                source="coordinator",
                data={
                    "jobs": jobs,
                    "why": pending.why,
                    "grace_s": pending.grace_s,
                    "away_s": away,
                    **(
                        {"rack_broker": self.rack_bridges.rack_of(pending.node)}
                        if pending.why == BRIDGE_DOWN
                        else {}
                    ),
                },
            )
        )

    async def _on_presence(self, levels: tuple[str, ...], message: Message) -> bool:
        node, job = levels[1], levels[3]
        presence = decode(message.payload, JobPresence) if message.payload else None
        if presence is not None and (presence.node != node or presence.job != job):
            raise DecodeError("job presence does not match its topic")
        # Authority follows placement; clearing its own presence (no ranks) is always a node's right.
        claims = presence is not None and (
            presence.ranks or presence.allocation is not None or presence.supervisor is not None
        )
        if presence is not None and claims and self.placement.check(node, [job]):
            self.placement.violation(node, job, "presence", f"ranks {[r.rank for r in presence.ranks][:16]}")
            return True
        self.state.apply_presence(node, job, presence)
        await self.presence_memory.observe(node, job, presence)
        if presence is not None and presence.ranks and self.slow_ranks.cfg.enabled:
            self.time_left.want(job)  # the time limit the slow-rank cost model weighs, looked up aside
        if presence is not None and presence.ranks:
            self.interruptions.watch(job, node)  # preemption/time limit, polled aside (issue #37)
        for event in self.slow_ranks.observe(node, job, presence):  # issue #33: step timing
            log.warning("rank_slow", job=job, node=event.node, scope=event.data.get("scope"))
            await self.engine.handle_event(event)
        await self.spare_release.check(job, self.state.jobs.get(job))
        bad = {n for n, reasons in self.state.conditions.items() if reasons}
        await self.checkpoint_partners.check(job, self.state.jobs.get(job), bad)
        return True

    async def _on_conditions(self, levels: tuple[str, ...], message: Message) -> bool:
        """A node's active critical conditions as its agent sees them (retained; shown by the API and
        ``ftd status``). Only the agent's own summary (``conditions/ftd``) is read."""
        if len(levels) != 4 or levels[3] != topics.FTD_CONDITIONS:
            raise DecodeError("unexpected conditions topic")
        if not message.payload:
            self.state.apply_conditions(levels[1], [])
            return True
        summary = decode(message.payload, NodeConditions)
        if summary.node != levels[1]:
            raise DecodeError(f"conditions of node {summary.node!r} published under node {levels[1]!r}")
        self.state.apply_conditions(
            summary.node,
            [c[:300] for c in summary.conditions[:64]],
            [k[:40] for k in summary.kinds[:64]],
            since=summary.ts or None,
        )
        return True

    async def _on_ack(self, levels: tuple[str, ...], message: Message) -> bool:
        ack = decode(message.payload, Ack)
        if ack.node != levels[1]:
            raise DecodeError(f"ack from node {ack.node!r} published under node {levels[1]!r}")
        # A rank's ack counts only from a node the scheduler runs its job on; a node-level answer
        # (rank NODE_RANK) only from the node its directive was sent to.
        if ack.rank != NODE_RANK and self.placement.check(ack.node, [ack.job]):
            detail = f"rank {ack.rank} directive {ack.directive_id[:100]}"
            self.placement.violation(ack.node, ack.job, "ack", detail)
            return True
        target = self.directives.node_of(ack.directive_id) if ack.rank == NODE_RANK else None
        if target is not None and target != ack.node:
            detail = f"answer to directive {ack.directive_id[:100]} sent to {target}"
            self.placement.violation(ack.node, ack.job or "-", "node_ack", detail)
            return True
        log.info(
            "trainer_ack", job=ack.job, rank=ack.rank, ok=ack.ok, step=ack.step, directive=ack.directive_id
        )
        self.acks.record(ack)
        return True

    def summary(self) -> dict[str, Any]:
        return {
            **self.engine.counters,
            "bad_messages": self.bad_messages,
            "folded": self.inputs.folded_total,
            "storage_errors": self.storage_errors,
            "receipts_sent": self.receipts_sent,
            "placement_violations": self.placement.violations,
            "placement_unverified": self.placement.unverified,
        }
