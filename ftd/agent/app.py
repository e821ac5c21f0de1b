"""The node agent: watchers -> storm control -> durable outbox -> bus, and bus directives -> actions.

One asyncio process per node. Its MQTT session is its heartbeat: the retained ``online`` status is
published on every connect and the broker publishes the Last Will ``offline`` if the agent dies.
A clean shutdown publishes ``offline`` itself.

Outbound path: every watcher calls :meth:`Agent.emit`; :class:`~ftd.agent.storm.StormControl` lets
first occurrences through at once and folds repeats into one counted summary per window; the
:class:`~ftd.agent.spool.Outbox` appends each event to the on-disk spool under ``state_dir`` before
publishing and tombstones it after the PUBACK, so neither a broker outage nor an agent restart loses
an event (the coordinator drops re-published duplicates by id).

Watchers are pluggable: any object with ``name`` and ``async run()`` (:mod:`ftd.agent.watchers.base`),
constructed as ``Watcher(cfg_section, node, emit)``. Each runs under
:class:`~ftd.agent.supervision.WatcherSupervisor`: a watcher that crashes or stops progressing is
reported as ``agent_health`` and restarted with backoff; one whose ``run()`` returns is done.
The whole agent ends (and systemd restarts it) only if a core task dies: the outbox publisher, the
directive pump or the storm flusher.

sd_notify: ``READY=1`` once subscribed and running; ``WATCHDOG=1`` from :mod:`ftd.agent.watchdog`'s
thread, only while the core tasks are alive and the event loop answers its heartbeat (a blocked loop
stops the pings, its stacks go to stderr, and systemd's ``WatchdogSec`` restarts us).

Inbound: job directives (``ftd/v1/nodes/{node}/directives/jobs``: the coordinator sends a job's
directives only to the nodes that run it) are relayed to the trainers of jobs this node hosts; node
directives (``gpu_reset``, ``collect_diagnostics``, ``preflight``) run as side tasks in
:mod:`ftd.agent.node_actions`, each answered with an :class:`~ftd.events.Ack` on
``ftd/v1/nodes/{node}/acks``.

Node hooks on the local socket (:mod:`ftd.agent.jobs`): the Slurm Prolog/Epilog report jobs starting
and ending here, published as the ``allocation`` of the job's retained presence (jobs without the
client included); every published event also feeds :class:`~ftd.agent.conditions.ConditionBook`, the
node's active critical conditions that ``ftd health`` asks for and, with
``agent.kubernetes.node_conditions``, :mod:`ftd.agent.node_conditions` writes to the Node.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import msgspec

from ftd import __version__
from ftd.agent import save_path
from ftd.agent.conditions import HARDWARE_KINDS, ConditionBook
from ftd.agent.gpu_reset import GpuResetter, Runner
from ftd.agent.jobs import (
    ENDED_JOBS_DIR,
    ConditionsMsg,
    HookMsg,
    JobEndMsg,
    JobStartMsg,
    SchedulerJobs,
    leftover_event,
)
from ftd.agent.local_api import LocalApi
from ftd.agent.local_api.inject import InjectMsg, injected_event
from ftd.agent.local_api.inject import reply as inject_reply
from ftd.agent.metrics import MetricsServer
from ftd.agent.node_actions import NodeActions
from ftd.agent.node_conditions import NodeConditionWriter
from ftd.agent.spool import Outbox, Outgoing
from ftd.agent.storm import StormControl
from ftd.agent.supervision import Named, WatcherSupervisor
from ftd.agent.watchdog import AgentWatchdog, FileKmsgProbe
from ftd.agent.watchers.base import Watcher
from ftd.agent.watchers.fs import FsWatcher
from ftd.agent.watchers.heartbeat import HeartbeatWatcher
from ftd.agent.watchers.host import HostWatcher
from ftd.agent.watchers.kmsg import KmsgWatcher
from ftd.agent.watchers.kmsg_checkpoint import KmsgCheckpoint
from ftd.agent.watchers.logfile import LogWatcher
from ftd.agent.watchers.memory import MemoryWatcher
from ftd.agent.watchers.nvml.backend import NvmlBackend
from ftd.agent.watchers.nvml.watcher import NvmlWatcher
from ftd.bus import topics
from ftd.bus.base import Bus, LastWill, Message
from ftd.client import protocol
from ftd.client.protocol import RUN_PARAM
from ftd.config import AgentConfig
from ftd.events import (
    Ack,
    CoordinatorStatus,
    DecodeError,
    Directive,
    Event,
    JobPresence,
    Kind,
    NodeConditions,
    NodeStatus,
    RankInfo,
    Receipt,
    Severity,
    decode,
    encode,
    make_event,
)
from ftd.logs import get_logger
from ftd.sdnotify import notify

log = get_logger(__name__)


def with_rank(event: Event, pids: dict[int, tuple[str, int]]) -> Event:
    """A segfault of a registered trainer rank's process, with that rank's ``job`` and ``rank`` in its
    data (rule ``host`` sends a GPU-library segfault of a job down the application-fault path)."""
    pid = event.data.get("pid")
    owner = pids.get(pid) if isinstance(pid, int) else None
    if owner is None or "job" in event.data:
        return event
    return msgspec.structs.replace(event, data={**event.data, "job": owner[0], "rank": owner[1]})


def status_messages(node: str, rack_broker: str = "") -> tuple[LastWill, Message]:
    """The Last Will (offline) and birth (online) messages for ``node``'s MQTT session; both name the
    rack broker the agent is on (``[bus] rack_broker``; empty: the core broker)."""
    topic = topics.node_status(node)
    offline = encode(
        NodeStatus(node=node, state="offline", agent_version=__version__, rack_broker=rack_broker)
    )
    online = encode(
        NodeStatus(
            node=node, state="online", ts=time.time(), agent_version=__version__, rack_broker=rack_broker
        )
    )
    return LastWill(topic, offline, retain=True), Message(topic, online, retain=True)


class Agent:
    def __init__(
        self,
        cfg: AgentConfig,
        *,
        bus: Bus,
        node: str | None = None,
        watchers: Sequence[Watcher] | None = None,
        gpu_runner: Runner | None = None,
        nvml_backend: NvmlBackend | None = None,
        stall_s: float = 120.0,
        health_interval_s: float = 1.0,
        rack_broker: str = "",
    ) -> None:
        self.cfg = cfg
        self.node = node or cfg.resolved_node()
        self.rack_broker = rack_broker  # [bus] rack_broker, said in every status (status_messages)
        self.bus = bus
        self.supervisor = WatcherSupervisor(stall_s, self.health_event)
        self.health_interval_s = health_interval_s
        state_dir = Path(cfg.state_dir)
        self._startup_problems: list[dict[str, Any]] = []
        self.outbox = self._open_outbox(state_dir)
        # The kmsg position file is also storm control's checkpoint: one object, handed to both.
        kmsg_checkpoint = KmsgCheckpoint(state_dir / "kmsg.position", fsync=cfg.spool.fsync)
        self.storm = StormControl(
            self._publish_event,
            window_s=cfg.storm.window_s,
            follow_window_s=cfg.storm.follow_window_s,
            checkpoint=kmsg_checkpoint,
        )
        self.local_api = LocalApi(
            cfg.socket_path,
            self.node,
            on_presence=self._on_presence,
            on_ack=self._on_ack,
            socket_mode=cfg.socket_mode,
            socket_group=cfg.socket_group,
            on_hook=self._on_hook,
            on_event=self.emit,  # a rank supervisor lost or failed (ftd run, issue #24)
        )
        # Jobs the Slurm Prolog reported (with or without the client) and the node's active critical
        # conditions (what `ftd health` reports): ftd.agent.jobs, ftd.agent.conditions.
        self.scheduler_jobs = SchedulerJobs(state_dir / "jobs.json")
        self.conditions = ConditionBook(state_dir / "conditions.json")
        self._conditions_published: list[str] | None = None
        self.node_conditions: NodeConditionWriter | None = None
        if cfg.kubernetes.node_conditions:  # ftd's view as a Kubernetes node condition (NPD-style)
            self.node_conditions = NodeConditionWriter(cfg.kubernetes, self.node, self.conditions)
        self.kmsg = KmsgWatcher(
            cfg.kmsg_path,
            self.node,
            self.emit,
            checkpoint=kmsg_checkpoint,
            from_start=cfg.kmsg_from_start,
            storm=self.storm,  # it offers its events (and repeats, without the event) to storm control
        )
        self.heartbeat = HeartbeatWatcher(cfg.heartbeat, self.node, self.emit, local_api=self.local_api)
        self.watchers: list[Watcher] = [Named("kmsg", self.kmsg), self.heartbeat]
        self.watchers.extend(self._configured_watchers(nvml_backend))
        # Host state from sysfs/procfs: read-only remounts, md, NVMe, IB ports and counters, EDAC (#23).
        self.watchers.append(HostWatcher(self.node, self.emit))
        # The checkpoint directories the ranks registered: read-only, full, unresponsive (issue #23).
        self.save_path = save_path.SavePathWatcher(
            self.node,
            self.emit,
            self.local_api.jobs,
            interval_s=min(cfg.fs.save_path_interval_s, stall_s / 4),  # never "stalled" between checks
            timeout_s=cfg.fs.save_path_timeout_s,
            shared_mounts=cfg.fs.shared_mounts,
        )
        self.watchers.append(self.save_path)
        self.watchers.extend(watchers or ())
        if self.node_conditions is not None:
            self.watchers.append(self.node_conditions)
        self.gpu_resetter = GpuResetter(self.node, runner=gpu_runner)
        self._nvml_backend = nvml_backend  # preflight asks the same NVML the watcher does
        self.events_by_kind: dict[str, int] = {}  # published, after storm control (the metrics)
        self.metrics = MetricsServer(self, cfg.metrics) if cfg.metrics.port else None
        self.node_actions = NodeActions(
            self.node,
            outbox=self.outbox,
            emit=self.emit,
            gpu_resetter=self.gpu_resetter,
            jobs=self.local_api.jobs,
            preflight_now=self._preflight_now,
            diagnostics_dir=state_dir / "diagnostics",
        )
        self.bad_messages = 0
        self.events_emitted = 0
        self.watcher_restarts = self.supervisor.restarts  # by watcher name
        self._reported_drops = 0
        self._tasks: list[asyncio.Task[Any]] = []
        self._core: list[asyncio.Task[Any]] = []
        self._side: set[asyncio.Task[Any]] = set()
        # A thread that notices a stalled loop or kernel-log reader and feeds systemd's watchdog.
        self.watchdog = AgentWatchdog(healthy=self.healthy, kmsg=FileKmsgProbe(self.kmsg))
        self._jobs_here: set[str] = set()  # jobs with a registered rank on this node

    def _open_outbox(self, state_dir: Path) -> Outbox:
        """The outbox on its spool. A spool that cannot be written (full disk) is no reason to stop:
        the outbox holds events in memory and the health loop reports each outage once
        (``spool_unavailable``) and its end (``spool_recovered``); see :mod:`ftd.agent.spool`."""
        spool = self.cfg.spool
        self._spool_reported = (0, 0)  # (outages, recoveries) reported so far
        try:
            return Outbox(
                self.bus,
                max_entries=self.cfg.outbox_max,
                path=state_dir / "outbox.spool",
                max_bytes=int(spool.max_mb * (1 << 20)),
                fsync=spool.fsync,
            )
        except OSError as exc:  # unreadable spool or state_dir: run, but say loudly that nothing is durable
            log.error("spool_unavailable_memory_only", error=str(exc))
            self._startup_problems.append({"problem": "spool_unavailable", "error": str(exc)})
            return Outbox(self.bus, max_entries=self.cfg.outbox_max)

    async def _report_spool(self) -> None:
        """Spool outages (once each, with the error) and recoveries, as ``agent_health`` events."""
        outbox = self.outbox
        outages, recoveries = self._spool_reported
        if outbox.spool_outages > outages:
            await self.health_event(
                Severity.ERROR,
                problem="spool_unavailable",
                error=outbox.last_spool_error,
                outage=outbox.spool_outages,  # numbered: storm control never folds two outages
                held=len(outbox),
                detail="events are held in memory only until the spool can be written again",
            )
        if outbox.spool_recoveries > recoveries:
            await self.health_event(
                Severity.INFO,
                problem="spool_recovered",
                outage=outbox.spool_recoveries,
                held=len(outbox),
            )
        self._spool_reported = (outbox.spool_outages, outbox.spool_recoveries)

    def _configured_watchers(self, nvml_backend: NvmlBackend | None) -> list[Watcher]:
        """The configurable watchers (NVML, logs, filesystem, memory); off or empty sections are skipped."""
        cfg = self.cfg
        found: list[Watcher] = []
        if cfg.nvml.enabled:  # without NVML it logs "disabled" and idles; it never crashes the agent
            found.append(NvmlWatcher(cfg.nvml, self.node, self.emit, backend=nvml_backend))
        if cfg.logs.paths:
            found.append(LogWatcher(cfg.logs, self.node, self.emit))
        if cfg.fs.mounts:
            found.append(FsWatcher(cfg.fs, self.node, self.emit))
        if cfg.memory.enabled:
            found.append(MemoryWatcher(cfg.memory, self.node, self.emit, pids=self._trainer_pids))
        return found

    def _trainer_pids(self) -> dict[int, tuple[str, int]]:
        """pid -> (job, rank) of every trainer rank registered with the local API (memory watcher)."""
        return {
            rank.pid: (job, rank.rank)
            for job, ranks in self.local_api.jobs().items()
            for rank in ranks
            if rank.pid is not None
        }

    # --- outbound ------------------------------------------------------------------------------

    async def emit(self, event: Event) -> None:
        """Hand an event to storm control (called by watchers); first occurrences go out at once.
        A filesystem's event first gets its mount and the jobs saving there (issue #23)."""
        self.events_emitted += 1
        if event.kind in save_path.FS_KINDS:
            mounts = save_path.current_mounts(self.cfg.fs.shared_mounts)
            event = save_path.relate(event, self.local_api.jobs(), mounts)
        elif event.kind is Kind.SEGFAULT:
            event = with_rank(event, self._trainer_pids())
        await self.storm.process(event)

    async def _publish_event(self, event: Event) -> None:
        """Storm control's downstream: spool and queue for the bus."""
        self.events_by_kind[event.kind] = self.events_by_kind.get(event.kind, 0) + 1
        if self.conditions.observe(event):
            self._sync_conditions()
            if self.node_conditions is not None:
                self.node_conditions.poke()
        self.outbox.put(
            Outgoing(
                topics.node_event(self.node, event.kind),
                encode(event),
                priority=event.severity.rank,
                receipt_id=event.id,  # leaves the spool on the coordinator's receipt, not on PUBACK
            )
        )
        log.info(
            "event",
            kind=str(event.kind),
            severity=str(event.severity),
            id=event.id,
            code=event.data.get("code"),
            pci=event.data.get("pci"),
            count=event.count,
            caused_by=event.data.get("caused_by"),
        )

    async def health_event(self, severity: Severity, **data: Any) -> None:
        """Report the agent's own trouble as an ``agent_health`` event."""
        await self.emit(
            make_event(self.node, Kind.AGENT_HEALTH, severity=severity, source="agent", data=data)
        )

    async def _on_presence(self, job: str, ranks: list[RankInfo]) -> None:
        topic = topics.node_job(self.node, job)
        allocation = self.scheduler_jobs.get(job)  # the Prolog's word: the job runs here, client or not
        supervisor = self.local_api.supervisor(job)  # its rank supervisor here (ftd run), if any
        here = bool(ranks) or allocation is not None or supervisor is not None
        payload = (
            encode(
                JobPresence(
                    job=job,
                    node=self.node,
                    ranks=ranks,
                    ts=time.time(),
                    allocation=allocation,
                    supervisor=supervisor,
                )
            )
            if here
            else b""
        )
        # Not durable: replaying a stale presence after a restart would resurrect a gone job.
        self.outbox.put(Outgoing(topic, payload, retain=True, priority=3, durable=False))
        if not here:
            self._jobs_here.discard(job)
        elif job not in self._jobs_here:  # a job arrived: a still-full filesystem must not take it
            self._jobs_here.add(job)
            for watcher in self.watchers:
                if isinstance(watcher, FsWatcher):
                    await watcher.job_arrived(job)

    async def _on_hook(self, msg: HookMsg | InjectMsg) -> dict[str, Any]:
        """A node hook over the local socket: Prolog/Epilog job start and end, ``ftd health``'s
        question, ``ftd preflight`` through the agent (:mod:`ftd.agent.jobs`), ``ftd inject``'s drill
        event, published like any event this agent sees (:mod:`ftd.agent.local_api.inject`)."""
        if isinstance(msg, InjectMsg):
            event = injected_event(self.node, msg)
            log.info("event_injected", kind=str(event.kind), severity=str(event.severity), id=event.id)
            await self.emit(event)
            return inject_reply(event)
        if isinstance(msg, JobStartMsg):
            self.scheduler_jobs.start(msg)
            self.local_api.job_started(msg.job)  # directives pending for an earlier run are stale
            await self._on_presence(msg.job, self.local_api.jobs().get(msg.job, []))
            return dict(protocol.ok(protocol.JOB_START))
        if isinstance(msg, JobEndMsg):
            self.scheduler_jobs.end(msg.job)
            self.local_api.job_ended(msg.job)  # a supervisor of it lost here is forgotten
            await self._on_presence(msg.job, self.local_api.jobs().get(msg.job, []))
            if msg.leftover:
                await self.emit(leftover_event(self.node, msg))
            return dict(protocol.ok(protocol.JOB_END))
        if isinstance(msg, ConditionsMsg):
            active = self.conditions.active()
            return {
                "v": protocol.PROTOCOL_VERSION,
                "op": protocol.CONDITIONS,
                "node": self.node,
                "conditions": [c.to_dict() for c in active],
            }
        return await self._preflight_now()

    def _sync_conditions(self) -> None:
        """Publish the node's active critical conditions (retained ``conditions/ftd``) when they
        changed since the last time: the coordinator shows them (API, ``ftd status``)."""
        active = self.conditions.active()[:64]
        reasons = [c.reason for c in active]
        if reasons == self._conditions_published:
            return
        self._conditions_published = reasons
        summary = NodeConditions(
            node=self.node, ts=time.time(), conditions=reasons, kinds=[c.kind for c in active]
        )
        topic = topics.node_condition(self.node, topics.FTD_CONDITIONS)
        self.outbox.put(Outgoing(topic, encode(summary), retain=True, priority=3, durable=False))

    async def _ended_while_away(self) -> None:
        """End the jobs whose Epilog could not reach us (files in ``state_dir/ended-jobs``)."""
        for job in self.scheduler_jobs.ended_while_away(Path(self.cfg.state_dir) / ENDED_JOBS_DIR):
            log.info("job_ended_while_away", job=job)
            await self._on_presence(job, self.local_api.jobs().get(job, []))

    async def _preflight_now(self) -> dict[str, Any]:
        """Run the node's preflight checks now (:mod:`ftd.agent.preflight`); a pass clears hardware faults."""
        from ftd.agent.preflight.runner import run_preflight

        report = await asyncio.to_thread(run_preflight, self.cfg, self._nvml_backend)
        if report.ok:
            self.conditions.clear_all(why="preflight passed", kinds=HARDWARE_KINDS)
        return {"v": protocol.PROTOCOL_VERSION, "op": protocol.PREFLIGHT, **report.to_dict()}

    async def _on_ack(self, ack: Ack) -> None:
        self.outbox.put(Outgoing(topics.node_acks(self.node), encode(ack), priority=3))

    # --- inbound -------------------------------------------------------------------------------

    def _on_receipt(self, message: Message) -> None:
        receipt = decode(message.payload, Receipt, max_bytes=16 << 20)
        if receipt.node != self.node:
            raise DecodeError(f"receipt for node {receipt.node!r}")
        self.outbox.receipted(receipt.ids)
        if receipt.rejected:
            self.outbox.rejected(receipt.rejected)

    def _on_coordinator_status(self, message: Message) -> None:
        if not message.payload:
            return
        status = decode(message.payload, CoordinatorStatus)
        if status.state == "online":
            resent = self.outbox.resend_unreceipted()
            if resent:
                log.info("coordinator_online_resending_unreceipted", events=resent)

    async def _resend_overdue(self) -> None:
        """Events whose receipt is overdue go out again (a lost receipt, a coordinator that lost them)."""
        period = max(0.5, self.outbox.receipt_timeout_s / 4)
        while True:
            await asyncio.sleep(period)
            resent = self.outbox.resend_unreceipted(self.outbox.receipt_timeout_s)
            if resent:
                log.warning("receipts_overdue_resending", events=resent)

    async def _pump_directives(self) -> None:
        node_topic = topics.node_directives(self.node)
        jobs_topic = topics.node_job_directives(self.node)
        receipts_topic = topics.node_receipts(self.node)
        async for message in self.bus.messages():
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
                if (
                    not self.local_api.hosts(directive.job)
                    and not directive.params.get(RUN_PARAM)
                    and directive.action != "restart"
                ):
                    # No rank or rank supervisor (ftd run) of the job here and no run named: a job this
                    # node does not host. One that names its run stays pending for that run's ranks
                    # (they register again after an agent restart: the broker kept the directive for
                    # this session meanwhile); a restart stays pending for the job's supervisor.
                    log.info("directive_unknown_job_ignored", job=directive.job, directive_id=directive.id)
                    continue
                reached = await self.local_api.deliver(directive)
                log.info(
                    "directive_relayed",
                    action=directive.action,
                    job=directive.job,
                    ranks=reached,
                    directive_id=directive.id,
                )

    def _node_directive(self, directive: Directive) -> None:
        """A directive for the node itself: its handler (:mod:`ftd.agent.node_actions`) runs aside."""
        handler = self.node_actions.handler(directive.action)
        if handler is None:
            log.warning("node_directive_not_supported", action=directive.action, directive_id=directive.id)
            return
        self._spawn(handler(directive), name=f"{directive.action}:{directive.id}")

    def _spawn(self, coro: Coroutine[Any, Any, None], *, name: str) -> None:
        """Run ``coro`` as a side task: kept until done, cancelled by :meth:`close`."""
        task = asyncio.create_task(coro, name=name)
        self._side.add(task)
        task.add_done_callback(self._side.discard)

    # --- supervision ---------------------------------------------------------------------------

    def healthy(self) -> bool:
        return bool(self._core) and all(not task.done() for task in self._core)

    async def _health_loop(self) -> None:
        """Stall checks of the watchers, spool outages and drops reported (the systemd watchdog ping
        is :mod:`ftd.agent.watchdog`'s, from outside the loop)."""
        while True:
            await asyncio.sleep(self.health_interval_s)
            now = time.monotonic()
            self.supervisor.check_stalls(self.watchers, now)
            self.outbox.check_spool()  # in a spool outage: back to durable spooling once it can be
            await self._ended_while_away()
            self._sync_conditions()  # leftover processes that exited close their condition
            await self._report_spool()
            if self.outbox.dropped > self._reported_drops:
                dropped = self.outbox.dropped - self._reported_drops
                self._reported_drops = self.outbox.dropped
                await self.health_event(
                    Severity.WARNING,
                    problem="spool_dropped",
                    dropped=dropped,
                    total_dropped=self.outbox.dropped,
                )

    # --- lifecycle -----------------------------------------------------------------------------

    async def run(self, ready: Callable[[], None] | None = None) -> None:
        await self.local_api.start()
        if self.metrics is not None:
            await self.metrics.start()
        # Only this node's own job directives: the coordinator sends a job's directives to each node
        # the scheduler runs it on, and the broker's ACL lets a node read no other node's.
        await self.bus.subscribe(topics.node_job_directives(self.node))
        await self.bus.subscribe(topics.node_directives(self.node))
        await self.bus.subscribe(topics.node_receipts(self.node))
        await self.bus.subscribe(topics.COORDINATOR_STATUS)
        await self.bus.start()
        await self._ended_while_away()  # Epilogs that ran while the agent was down
        self._sync_conditions()  # the conditions kept across the restart (or none: clears the topic)
        for job in self.scheduler_jobs.all():  # jobs the Prolog reported before a restart
            await self._on_presence(job, self.local_api.jobs().get(job, []))
        self._core = [
            asyncio.create_task(self.outbox.run(), name="outbox"),
            asyncio.create_task(self._pump_directives(), name="directives"),
            asyncio.create_task(self.storm.run(), name="storm"),
        ]
        self._tasks = [
            *self._core,
            asyncio.create_task(self._health_loop(), name="health"),
            asyncio.create_task(self._resend_overdue(), name="resend-overdue"),
            *(
                asyncio.create_task(self.supervisor.supervise(w), name=f"supervise:{w.name}")
                for w in self.watchers
            ),
        ]
        for problem in self._startup_problems:
            await self.health_event(Severity.ERROR, **problem)
        for damage in self.outbox.damage:
            await self.health_event(
                Severity.ERROR,
                problem="spool_corrupt",
                quarantined=damage.quarantined,
                detail=damage.problem,
                salvaged=damage.salvaged,
                records=damage.records,
                skipped_bytes=damage.skipped_bytes,
                damaged_regions=damage.regions,
            )
        await self._report_spool()  # a spool that could not be rewritten at start
        if self.outbox.replayed:
            log.info("spooled_events_republishing", entries=self.outbox.replayed)
        notify("READY=1")
        self.watchdog.start()
        log.info(
            "agent_started",
            node=self.node,
            kmsg=self.cfg.kmsg_path,
            socket=self.cfg.socket_path,
            watchers=[w.name for w in self.watchers],
        )
        if ready is not None:
            ready()
        try:
            done, _ = await asyncio.wait(self._core, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # a crashed core task ends the agent loudly; systemd restarts it
        finally:
            await self.close()

    async def close(self, flush_s: float = 2.0) -> None:
        self.watchdog.stop()
        tasks, self._tasks = self._tasks, []
        side, self._side = list(self._side), set()
        outbox_task = next((t for t in tasks if t.get_name() == "outbox"), None)
        for task in [*tasks, *side]:
            if task is not outbox_task:
                task.cancel()
        with contextlib.suppress(Exception):
            await self.storm.close()  # pending repeat counts go out as summaries
        await self.local_api.stop()
        # A clean stop says so (not the Last Will's "offline"): the coordinator then waits the longer
        # grace (coordinator.offline_grace.clean_stop_s) for the restart before moving any job.
        stopped = encode(
            NodeStatus(
                node=self.node,
                state="stopped",
                ts=time.time(),
                agent_version=__version__,
                rack_broker=self.rack_broker,
            )
        )
        self.outbox.put(
            Outgoing(topics.node_status(self.node), stopped, retain=True, priority=3, durable=False)
        )
        if outbox_task is not None and not outbox_task.done():
            await self.outbox.flush(flush_s)
        for task in [*tasks, *side]:
            task.cancel()
        await asyncio.gather(*tasks, *side, return_exceptions=True)
        self.outbox.close()
        if self.metrics is not None:
            await self.metrics.stop()
        await self.bus.stop()
