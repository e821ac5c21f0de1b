"""The node agent's daemon: it runs the parts :mod:`ftd.agent.wiring` built, and builds none.

One asyncio process per node. Its MQTT session is its heartbeat: the retained ``online`` status is
published on every connect and the broker publishes the Last Will ``offline`` if the agent dies.
A clean shutdown publishes ``stopped`` itself.

Outbound path (assembled in :mod:`ftd.agent.wiring`): every watcher calls ``emit``;
:class:`~ftd.agent.storm.StormControl` lets first occurrences through at once and folds repeats into
one counted summary per window; everything it lets through leaves through the one door
(:class:`~ftd.agent.door.Door`: enriched with the job and rank of the process it names and the mount
it concerns, seen by the node's conditions) into the :class:`~ftd.agent.spool.Outbox`, which appends
each event to the on-disk spool under ``state_dir`` before publishing and keeps it until the
coordinator's receipt, so neither a broker outage nor an agent restart loses an event (the coordinator
drops re-published duplicates by id).

Watchers are pluggable: any object with ``name`` and ``async run()`` (:mod:`ftd.agent.watchers.base`),
constructed as ``Watcher(cfg_section, node, emit)``. Each runs under
:class:`~ftd.agent.supervision.WatcherSupervisor`: a watcher that crashes or stops progressing is
reported as ``agent_health`` and restarted with backoff; one whose ``run()`` returns is done.
The whole agent ends (and systemd restarts it) only if a core task dies: the outbox publisher, the
directive pump or the storm flusher.

sd_notify: ``READY=1`` once subscribed and running; ``WATCHDOG=1`` from :mod:`ftd.agent.watchdog`'s
thread, only while the core tasks are alive and the event loop answers its heartbeat (a blocked loop
stops the pings, its stacks go to stderr, and systemd's ``WatchdogSec`` restarts us).

Inbound (:mod:`ftd.agent.inbound`): receipts let the outbox forget what the coordinator took; job
directives (``ftd/v1/nodes/{node}/directives/jobs``: the coordinator sends a job's directives only to
the nodes that run it) are relayed to the trainers of jobs this node hosts; node directives
(``gpu_reset``, ``collect_diagnostics``, ``preflight``) run as side tasks in
:mod:`ftd.agent.node_actions`, each answered with an :class:`~ftd.events.Ack` on
``ftd/v1/nodes/{node}/acks``. What arrives on the local socket (job presence, the Slurm
Prolog/Epilog, ``ftd health``, ``ftd preflight``, ``ftd inject``, the ranks' acks) is answered by
:mod:`ftd.agent.hooks`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ftd import __version__
from ftd.agent.conditions import ConditionBook
from ftd.agent.door import Door
from ftd.agent.gpu_reset import GpuResetter
from ftd.agent.hooks import NodeHooks
from ftd.agent.inbound import Inbound
from ftd.agent.jobs import SchedulerJobs
from ftd.agent.local_api import LocalApi
from ftd.agent.metrics import MetricsServer
from ftd.agent.node_actions import NodeActions
from ftd.agent.node_conditions import NodeConditionWriter
from ftd.agent.spool import Outbox, Outgoing
from ftd.agent.storm import StormControl
from ftd.agent.supervision import Report, WatcherSupervisor
from ftd.agent.watchdog import AgentWatchdog, FileKmsgProbe
from ftd.agent.watchers.base import Emit, Watcher
from ftd.agent.watchers.kmsg import KmsgWatcher
from ftd.bus import topics
from ftd.bus.base import Bus, LastWill, Message
from ftd.config import AgentConfig
from ftd.events import (
    NodeStatus,
    Severity,
    encode,
)
from ftd.logs import get_logger
from ftd.sdnotify import notify

log = get_logger(__name__)


def status_messages(
    node: str, rack_broker: str = "", addresses: Sequence[str] = ()
) -> tuple[LastWill, Message]:
    """The Last Will (offline) and birth (online) messages for ``node``'s MQTT session; both name the
    rack broker the agent is on (``[bus] rack_broker``; empty: the core broker); the birth also the
    node's ``addresses`` (:mod:`ftd.agent.addresses`), so the coordinator can name it from a peer's
    error."""
    topic = topics.node_status(node)
    offline = encode(
        NodeStatus(node=node, state="offline", agent_version=__version__, rack_broker=rack_broker)
    )
    online = encode(
        NodeStatus(
            node=node,
            state="online",
            ts=time.time(),
            agent_version=__version__,
            rack_broker=rack_broker,
            addresses=list(addresses),
        )
    )
    return LastWill(topic, offline, retain=True), Message(topic, online, retain=True)


@dataclass
class AgentParts:
    """Everything the agent runs, each built once by :func:`ftd.agent.wiring.build_agent`."""

    cfg: AgentConfig
    node: str
    rack_broker: str  # [bus] rack_broker, said in every status (status_messages)
    bus: Bus
    outbox: Outbox
    startup_problems: list[dict[str, Any]]  # reported as agent_health once running (a spool outage)
    storm: StormControl
    door: Door
    emit: Emit  # every watcher's way in: storm control, then the door
    health: Report  # agent_health events, through emit
    local_api: LocalApi
    hooks: NodeHooks
    scheduler_jobs: SchedulerJobs
    conditions: ConditionBook
    node_conditions: NodeConditionWriter | None
    kmsg: KmsgWatcher
    watchers: list[Watcher]
    supervisor: WatcherSupervisor
    gpu_resetter: GpuResetter
    node_actions: NodeActions
    inbound: Inbound
    health_interval_s: float

    @property
    def events_by_kind(self) -> dict[str, int]:
        """Events published by kind, after storm control (the metrics)."""
        return self.door.events_by_kind


class Agent:
    """Runs the parts :func:`ftd.agent.wiring.build_agent` built; see the module docstring."""

    def __init__(self, parts: AgentParts, *, metrics: MetricsServer | None = None) -> None:
        self.cfg = parts.cfg
        self.node = parts.node
        self.rack_broker = parts.rack_broker
        self.bus = parts.bus
        self.outbox = parts.outbox
        self.storm = parts.storm
        self.door = parts.door
        self.emit = parts.emit
        self.health_event = parts.health
        self.local_api = parts.local_api
        self.hooks = parts.hooks
        self.scheduler_jobs = parts.scheduler_jobs
        self.conditions = parts.conditions
        self.node_conditions = parts.node_conditions
        self.kmsg = parts.kmsg
        self.watchers = parts.watchers
        self.supervisor = parts.supervisor
        self.gpu_resetter = parts.gpu_resetter
        self.node_actions = parts.node_actions
        self.inbound = parts.inbound
        self.health_interval_s = parts.health_interval_s
        self.metrics = metrics
        self._startup_problems = parts.startup_problems
        self._spool_reported = (0, 0)  # (outages, recoveries) reported so far
        self.watcher_restarts = self.supervisor.restarts  # by watcher name
        self._reported_drops = 0
        self._tasks: list[asyncio.Task[Any]] = []
        self._core: list[asyncio.Task[Any]] = []
        # A thread that notices a stalled loop or kernel-log reader and feeds systemd's watchdog.
        self.watchdog = AgentWatchdog(healthy=self.healthy, kmsg=FileKmsgProbe(self.kmsg))

    @property
    def events_by_kind(self) -> dict[str, int]:
        """Events published by kind, after storm control (the metrics)."""
        return self.door.events_by_kind

    @property
    def bad_messages(self) -> int:
        """Bus messages that could not be decoded (ignored)."""
        return self.inbound.bad_messages

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
            await self.hooks.ended_while_away()
            self.door.publish_conditions()  # leftover processes that exited close their condition
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
        for topic in self.inbound.topics():
            await self.bus.subscribe(topic)
        await self.bus.start()
        await self.hooks.ended_while_away()  # Epilogs that ran while the agent was down
        self.door.publish_conditions()  # the conditions kept across the restart (or none: clears it)
        await self.hooks.republish()  # jobs the Prolog reported before a restart
        self._core = [
            asyncio.create_task(self.outbox.run(), name="outbox"),
            asyncio.create_task(self.inbound.pump(), name="directives"),
            asyncio.create_task(self.storm.run(), name="storm"),
        ]
        self._tasks = [
            *self._core,
            asyncio.create_task(self._health_loop(), name="health"),
            asyncio.create_task(self.inbound.resend_overdue(), name="resend-overdue"),
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
        side = list(self.inbound.side)
        outbox_task = next((t for t in tasks if t.get_name() == "outbox"), None)
        for task in [*tasks, *side]:
            if task is not outbox_task:
                task.cancel()
        with contextlib.suppress(Exception):
            await self.storm.close()  # pending repeat counts go out as summaries
        with contextlib.suppress(Exception):
            await self.hooks.close()  # the job path checks' rendezvous probes (issue #36)
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
