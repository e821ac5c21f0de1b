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

One node cannot crash, stall or starve the coordinator (DESIGN §11, :mod:`ftd.coordinator.intake.fairness`):

* Size first: a payload over :data:`~ftd.events.MAX_PAYLOAD_BYTES` (a batch: :data:`MAX_BATCH_BYTES`)
  is refused unread; decoding raises nothing but ``DecodeError`` (depth, types, encoding included).
* Every refused message of a node -- oversized, undecodable, wrong types, speaking for another node,
  a handler failure -- is counted in ``bad_messages`` and in that node's ``bad_input`` summary event
  (never stored itself), and the events in it whose ids can be read are receipted as ``rejected``.
* Rate: each node has a token bucket (``node_rate`` events/s, bursts of ``node_burst``, and an
  ``urgent_reserve`` only errors and worse may use). Its events over the rate are *folded* -- counted
  into its ``bad_input`` summary, receipted once that is committed -- so a flood costs a decode and
  a count per event, and other nodes' events keep their latency (``ftd bench fairness``).
* A batch is checked and handled in chunks of :data:`BATCH_CHUNK` events, the bus pump yielding to
  the event loop between them (receipts, the API and running actions go on meanwhile); still all or
  nothing: one bad event refuses the whole batch before any of it is handled.

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
import sqlite3
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from ftd import __version__
from ftd.bus import topics
from ftd.bus.base import Bus, BusUnavailable, LastWill, Message
from ftd.config import Config
from ftd.coordinator.actions import BuiltinExecutors, ExecutorContext
from ftd.coordinator.actions.acks import AckBook
from ftd.coordinator.actions.scheduler import Scheduler
from ftd.coordinator.decide.engine import Engine
from ftd.coordinator.decide.plugins import (
    collect_executors,
    describe_plugins,
    disabled_plugins,
    make_plugin_manager,
)
from ftd.coordinator.decide.policy import PolicyGate
from ftd.coordinator.intake.fairness import (
    NODE_BURST,
    NODE_RATE,
    URGENT_RESERVE,
    WINDOW_S,
    InputBook,
    RateLimiter,
    readable_ids,
)
from ftd.coordinator.intake.placement import NeedPlacement, Placement
from ftd.coordinator.intake.presence_memory import PresenceMemory
from ftd.coordinator.ledger.sqlite import Ledger, as_store
from ftd.coordinator.ledger.store import LedgerStore
from ftd.coordinator.model.state import ClusterState
from ftd.coordinator.upkeep.reconcile import Reconciler
from ftd.coordinator.upkeep.return_service import ReturnToService
from ftd.events import (
    MAX_PAYLOAD_BYTES,
    NODE_RANK,
    Ack,
    CoordinatorStatus,
    DecodeError,
    Directive,
    Event,
    JobPresence,
    Kind,
    NodeConditions,
    NodeState,
    NodeStatus,
    Receipt,
    Severity,
    decode,
    encode,
)
from ftd.logs import get_logger
from ftd.sdnotify import notify, ping_watchdog

if TYPE_CHECKING:
    from ftd.coordinator.ha.runner import HaStatus

log = get_logger(__name__)


MAX_BATCH_BYTES = 4 << 20  # a batched event message larger than this is rejected unread
BATCH_CHUNK = 256  # events of a batch checked or handled between two yields to the event loop
ACK_EVERY = 10  # handled messages whose acknowledgement waits, at most (Mosquitto allows 20 in flight)
ACK_DELAY_S = 0.002  # ... and for this long at most


@dataclass
class _PendingReceipt:
    """What a node's next receipt will say (gathered for ``RECEIPT_BATCH_S``, sent as one message)."""

    ids: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)


class _Refused(Exception):
    """A message the coordinator will not take: ``reason`` (a summary key), ``error`` (for the log and
    the rejected receipts) and the ids of the events in it, when they could be read."""

    def __init__(self, reason: str, error: str, ids: list[str] | None = None) -> None:
        super().__init__(error)
        self.reason, self.error, self.ids = reason, error, ids or []


SUBSCRIPTIONS = (
    topics.ALL_NODE_STATUS,
    topics.ALL_NODE_JOBS,
    topics.ALL_NODE_ACKS,
    topics.ALL_NODE_EVENTS,
    topics.ALL_NODE_CONDITIONS,
)


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
        ledger: LedgerStore | Ledger | None = None,
        extra_plugins: tuple[object, ...] = (),
        node_rate: float = NODE_RATE,
        node_burst: float = NODE_BURST,
        urgent_reserve: float = URGENT_RESERVE,
        summary_window_s: float = WINDOW_S,
    ) -> None:
        """``node_rate`` / ``node_burst`` / ``urgent_reserve``: each node's token bucket, and
        ``summary_window_s`` the span of one ``bad_input`` summary (see the module docstring)."""
        cfg = config.coordinator
        self.config = config
        self.bus = bus
        self.scheduler = scheduler
        self.state = ClusterState()
        self.acks = AckBook()
        self.ledger: LedgerStore = as_store(ledger or Ledger(cfg.ledger_path))
        self.loaded = False  # the engine's and the reconciler's memory read from the ledger (load())
        self.ha: HaStatus | None = None  # who leads, when run by ha.runner (PostgreSQL ledger)
        self.bad_messages = 0
        self.storage_errors = 0  # messages left unacknowledged because the ledger could not commit
        self.receipts_sent = 0
        self._receipts: dict[str, _PendingReceipt] = {}  # node -> what to tell it next
        self._receipts_ready = asyncio.Event()
        self.limiter = RateLimiter(node_rate, node_burst, urgent_reserve)
        limits = {"rate": node_rate, "burst": node_burst, "urgent_reserve": urgent_reserve}
        self.inputs = InputBook(window_s=summary_window_s, limits=limits)
        self._acks: list[Message] = []  # handled, their acknowledgement not sent yet
        # which job runs where, kept in the ledger: known at start before the broker re-sends it
        self.presence_memory = PresenceMemory(self.ledger, self.state)
        place = cfg.placement
        self.placement = Placement(
            scheduler,
            enforce=place.enforce,
            ttl_s=place.ttl_s,
            refresh_s=place.refresh_s,
            lookup_timeout_s=place.lookup_timeout_s,
            retry_s=place.retry_s,
        )
        self._directive_nodes: dict[str, str] = {}  # node directive id -> the node it was sent to
        if not self.placement.enforced:
            why = "disabled in config" if scheduler is not None else "no scheduler"
            log.warning("placement_not_enforced", reason=why, effect="any node may speak for any job")
        self._flush_due = asyncio.Event()
        builtin = BuiltinExecutors(
            ExecutorContext(
                config=config,
                state=self.state,
                acks=self.acks,
                publish=self._publish,
                scheduler=scheduler,
                job_moved=self.placement.forget,
            )
        )
        plugins = make_plugin_manager(
            disabled=cfg.disabled_rules,
            extra=(builtin, *extra_plugins),
            rule_dirs=cfg.rule_dirs,
            rules_file=cfg.rules_file,
        )
        executors = collect_executors(plugins)
        log.info(
            "rules_loaded",
            rules=[f"{p.name} ({p.source}: {', '.join(p.hooks)})" for p in describe_plugins(plugins)],
            disabled=disabled_plugins(plugins),
        )
        gate = PolicyGate.from_config(cfg)
        self.engine = Engine(
            state=self.state, ledger=self.ledger, gate=gate, plugins=plugins, executors=executors
        )
        # ftd's drains from the ledger before any event is decided; kept in step with the scheduler
        self.reconciler = Reconciler(
            state=self.state,
            ledger=self.ledger,
            scheduler=scheduler,
            engine=self.engine,
            interval_s=cfg.reconcile_interval_s,
            pending_alert_s=cfg.pending_alert_s,
        )
        self.engine.observe(self.reconciler.observe)
        if cfg.return_to_service.rules:  # opt-in per rule: reset -> preflight -> resume or RMA
            self.return_to_service = ReturnToService(
                self.engine.submit, rules=cfg.return_to_service.rules, state=self.state
            )
            self.engine.observe(self.return_to_service.observe)
            loaded = {p.name for p in describe_plugins(plugins)}
            unknown = sorted(set(cfg.return_to_service.rules) - loaded)
            if unknown:  # a typo would silently keep those resets out of return to service
                log.warning("return_to_service_rules_not_loaded", rules=unknown, loaded=sorted(loaded))
        self._handlers: Mapping[str, Callable[[tuple[str, ...], Message], Awaitable[bool]]] = {
            "events": self._on_event,
            "status": self._on_status,
            "jobs": self._on_presence,
            "acks": self._on_ack,
            "conditions": self._on_conditions,
        }

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

    async def _publish(self, topic: str, payload: bytes) -> None:
        self._note_node_directive(topic, payload)
        await self.bus.publish(topic, payload)

    MAX_DIRECTIVE_NODES = 10_000  # node directives remembered for checking who answers them

    def _note_node_directive(self, topic: str, payload: bytes) -> None:
        """Remember the node each node directive (gpu_reset, diagnostics) was sent to: its answer
        (an ack of rank NODE_RANK) counts only from that node. Directive ids derive from action ids,
        which a node sees in its own directives, so another node could guess them."""
        levels = topic.split("/")
        if len(levels) != 5 or levels[2] != "nodes" or levels[4] != "directives":
            return
        try:
            directive = decode(payload, Directive)
        except DecodeError:
            return
        self._directive_nodes[directive.id] = levels[3]
        if len(self._directive_nodes) > self.MAX_DIRECTIVE_NODES:
            del self._directive_nodes[next(iter(self._directive_nodes))]

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
        from ftd.coordinator.api.server import start_api  # HTTP API + dashboard (None when disabled)

        await self.load()
        self.api = await start_api(self)
        await self.start()
        await self.bus.wait_connected()
        await self.placement.warm()  # every running job's nodes in one call, before the retained presence
        await self._forget_stopped_jobs()
        # Handle (not just receive) what the broker delivers first -- retained status and job presence,
        # acks it queued for this persistent session while we were down -- before resuming actions that
        # depend on it: a resumed checkpoint_restart must know the job's ranks and see acks sent meanwhile.
        pump = asyncio.create_task(self._pump(), name="bus-messages")
        receipts = asyncio.create_task(self._send_receipts(), name="receipts")
        flusher = asyncio.create_task(self._flush_when_due(), name="acks")
        watchdog: asyncio.Task[None] | None = None
        reconcile: asyncio.Task[None] | None = None
        try:
            await asyncio.sleep(0.5)
            await self.engine.resume_unfinished()
            reconcile = asyncio.create_task(self.reconciler.run(), name="reconcile")
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
            if watchdog is not None:
                watchdog.cancel()
            if reconcile is not None:
                reconcile.cancel()

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
            self._receipt(node, ids)
        for node, reasons in done.rejected.items():
            self._receipt(node, [], reasons)
        return True

    RECEIPT_BATCH_S = 0.02  # receipts gathered this long go out as one message per node

    async def _send_receipts(self) -> None:
        """Publish pending receipts, one message per node, after the events were committed."""
        while True:
            await self._receipts_ready.wait()
            await asyncio.sleep(self.RECEIPT_BATCH_S)
            self._receipts_ready.clear()
            pending, self._receipts = self._receipts, {}
            ts = time.time()
            receipts = {n: Receipt(node=n, ts=ts, ids=r.ids, rejected=r.rejected) for n, r in pending.items()}
            results = await asyncio.gather(
                *(self.bus.publish(topics.node_receipts(node), encode(r)) for node, r in receipts.items()),
                return_exceptions=True,
            )
            for (node, receipt), result in zip(receipts.items(), results, strict=True):
                if isinstance(result, BaseException):
                    self._receipt(node, receipt.ids, receipt.rejected)  # try again once reconnected
                    await self.bus.wait_connected(timeout=1.0)
                else:
                    self.receipts_sent += 1

    def _receipt(self, node: str, ids: list[str], rejected: Mapping[str, str] | None = None) -> None:
        pending = self._receipts.get(node)
        if pending is None:
            pending = self._receipts[node] = _PendingReceipt()
        pending.ids.extend(ids)
        if rejected:
            pending.rejected.update(rejected)
        self._receipts_ready.set()

    async def close(self) -> None:
        api = getattr(self, "api", None)
        if api is not None:
            await api.stop()
        await self.engine.close()
        await self.placement.close()
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
            if len(levels) < 3 or levels[0] != "nodes":
                raise DecodeError("unexpected topic")
            node = topics.check_level(levels[1], "node")
            events = levels[2] == "events"
            batch = events and levels[3:] == (topics.EVENT_BATCH,)
            limit = MAX_BATCH_BYTES if batch else MAX_PAYLOAD_BYTES
            if len(message.payload) > limit:
                ids = readable_ids(message.payload, batch=batch) if events else []
                why = f"payload of {len(message.payload)} bytes is over the limit of {limit}"
                raise _Refused("oversized", why, ids)
            if batch:
                return await self._on_batch(node, message)
            handler = self._handlers.get(levels[2])
            if handler is None:
                raise DecodeError("unexpected topic")
            return await handler(levels, message)
        except _Refused as refused:
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

    def _refuse(
        self, message: Message, node: str | None, reason: str, error: str, ids: list[str] | None = None
    ) -> bool:
        """Count a refused message; into its node's summary (and rejected receipts) when it has one."""
        self.bad_messages += 1
        if self.bad_messages <= 20 or self.bad_messages % 1000 == 0:
            log.warning(
                "bad_bus_message_ignored",
                topic=message.topic[:200],
                reason=reason,
                error=error[:300],
                bytes=len(message.payload),
                total=self.bad_messages,
            )
        if node is not None and self.inputs.reject(node, reason, error, len(message.payload), ids):
            log.warning("bad_input_from_node", node=node, reason=reason, summary="bad_input event")
        return True

    def _fold(self, event: Event) -> None:
        if self.inputs.fold(event):
            log.warning(
                "node_rate_limited",
                node=event.node,
                rate=self.limiter.rate,
                burst=self.limiter.burst,
                summary="events over the rate are folded into a bad_input event",
            )

    async def _on_event(self, levels: tuple[str, ...], message: Message) -> bool:
        node = levels[1]
        try:
            event = decode(message.payload, Event)
        except DecodeError as exc:
            raise _Refused("invalid", str(exc), readable_ids(message.payload, batch=False)) from None
        if event.node != node:
            why = f"event for node {event.node!r} published under node {node!r}"
            raise _Refused("foreign_node", why, [event.id])
        if self._foreign_job_claims([event]):
            return True
        if not self.limiter.admit(node, event.severity):
            self._fold(event)
            return True
        await self.engine.handle_event(event)
        self._receipt(node, [event.id])
        return True

    async def _on_batch(self, node: str, message: Message) -> bool:
        """``ftd/v1/nodes/{node}/events/batch``: a JSON list of Events, all of that node (the ACL
        vouches for the topic). Checked as a whole before any is handled: one bad event refuses the
        batch, so a batch is never half-applied. Both passes go in chunks of :data:`BATCH_CHUNK`."""
        try:
            raws = decode(message.payload, list[msgspec.Raw], max_bytes=MAX_BATCH_BYTES)
            events: list[Event] = []
            for start in range(0, len(raws), BATCH_CHUNK):
                for raw in raws[start : start + BATCH_CHUNK]:
                    event = decode(bytes(raw), Event)
                    if event.node != node:
                        why = f"event for node {event.node!r} in a batch under node {node!r}"
                        raise _Refused("foreign_node", why, readable_ids(message.payload, batch=True))
                    events.append(event)
                await asyncio.sleep(0)
        except DecodeError as exc:
            ids = readable_ids(message.payload, batch=True)
            raise _Refused("invalid", f"{exc} (in a batch)", ids) from None
        forged = self._foreign_job_claims(events)
        if forged:
            events = [e for e in events if e.id not in forged]
        admitted: list[Event] = []
        for event in events:
            if self.limiter.admit(node, event.severity):
                admitted.append(event)
            else:
                self._fold(event)
        for start in range(0, len(admitted), BATCH_CHUNK):
            if start:
                await asyncio.sleep(0)
            chunk = admitted[start : start + BATCH_CHUNK]
            await self.engine.handle_events(chunk)  # one commit per chunk: the storm's hot path
            self._receipt(node, [e.id for e in chunk])
        return True

    _HEARTBEAT_KINDS = frozenset({Kind.RANK_HEARTBEAT_LOST, Kind.RANK_STRAGGLER})

    def _foreign_job_claims(self, events: list[Event]) -> set[str]:
        """Ids of heartbeat events (rank lost, straggler) naming a job the scheduler does not run on
        their node: each is a placement violation, receipted as rejected and never evaluated (it
        would restart or flag another node's job). Raises NeedPlacement for jobs not known yet."""
        claims = [
            (e, str(e.data["job"]))
            for e in events
            if e.kind in self._HEARTBEAT_KINDS
            and isinstance(e.data.get("job"), str | int)
            and str(e.data["job"])
        ]
        if not claims:
            return set()
        node = claims[0][0].node
        denied = set(self.placement.check(node, [job for _, job in claims]))
        forged: set[str] = set()
        for event, job in claims:
            if job in denied:
                forged.add(event.id)
                self.placement.violation(node, job, str(event.kind), f"rank {event.data.get('rank')}")
                why = f"placement_violation: job {job[:64]} does not run on {node}"
                self._receipt(node, [], {event.id: why})
        return forged

    async def _on_status(self, levels: tuple[str, ...], message: Message) -> bool:
        if not message.payload:
            return True
        status = decode(message.payload, NodeStatus)
        if status.node != levels[1]:
            raise DecodeError(f"status for node {status.node!r} published under node {levels[1]!r}")
        changed = self.state.apply_status(status)
        log.info("node_status", node=status.node, state=status.state, retained=message.retain)
        if changed and status.state == "offline":
            await self.engine.handle_event(
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
        return True

    async def _on_presence(self, levels: tuple[str, ...], message: Message) -> bool:
        node, job = levels[1], levels[3]
        presence = decode(message.payload, JobPresence) if message.payload else None
        if presence is not None and (presence.node != node or presence.job != job):
            raise DecodeError("job presence does not match its topic")
        # Authority follows placement; clearing its own presence (no ranks) is always a node's right.
        claims = presence is not None and (presence.ranks or presence.allocation is not None)
        if presence is not None and claims and self.placement.check(node, [job]):
            self.placement.violation(node, job, "presence", f"ranks {[r.rank for r in presence.ranks][:16]}")
            return True
        self.state.apply_presence(node, job, presence)
        await self.presence_memory.observe(node, job, presence)
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
        self.state.apply_conditions(summary.node, [c[:300] for c in summary.conditions[:64]])
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
        target = self._directive_nodes.get(ack.directive_id) if ack.rank == NODE_RANK else None
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
