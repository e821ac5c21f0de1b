"""The agent's own Prometheus metrics, served on a local port (``agent.metrics``; off by default).

What: a collector that reads the agent's live state at scrape time (nothing is counted twice):

=========================================  =========================================================
``ftd_agent_bus_connected``                1 while the agent's MQTT connection is up
``ftd_agent_spool_entries``                events and messages held: queued, or sent and waiting for
                                           the coordinator's receipt
``ftd_agent_spool_oldest_age_seconds``     how long the oldest of them has been held
``ftd_agent_spool_dropped_total``          entries dropped because the outbox was full
``ftd_agent_spool_available``              0 while the spool file cannot be written (memory only)
``ftd_agent_kmsg_lines_total``             kernel log lines/records read
``ftd_agent_kmsg_lag_seconds``             how late the newest /dev/kmsg record was when read
``ftd_agent_kmsg_overruns_total``          /dev/kmsg records lost before they were read
``ftd_agent_watcher_up{watcher}``          1 while the watcher's task runs and it can watch (0: its
                                           task is down, or it is ``unavailable``: NVML broken on a
                                           node with GPUs)
``ftd_agent_watcher_state{watcher,state,reason}``  1, for the watcher's state: ``running``, ``idle``
                                           (nothing to watch here), ``unavailable``, ``down``
``ftd_agent_watcher_restarts_total{watcher}``  restarts after a crash or a stall
``ftd_agent_events_total{kind}``           events published, by kind (after storm control)
``ftd_agent_cloud_polls_total{provider}``  metadata-server requests for interruption notices
``ftd_agent_cloud_errors_total{provider,reason}``  failed polls and refused notices, by reason
``ftd_agent_cloud_notices_total{source}``  interruption notices published (issue #37)
``ftd_agent_supervisors{role,state}``      the jobs' rank supervisors here (``ftd run``)
``ftd_agent_supervisors_lost_total``       supervisors whose connection closed without a goodbye
``ftd_agent_loop_stalls_total``            event-loop stalls the watchdog thread saw (``ftd.agent.watchdog``)
``ftd_agent_loop_stall_longest_seconds``   the longest of them
``ftd_agent_kmsg_stalls_total``            kernel-log reader stalls: no progress while input waited
``ftd_agent_watchdog_pings_total``         ``WATCHDOG=1`` sent to systemd
=========================================  =========================================================

Why a port of its own: the agent has no HTTP API (its local API is a Unix socket for trainers);
Prometheus scrapes each node's agent like a node exporter. Served by aiohttp inside the agent's
event loop, so a scrape reads the state between two steps of the loop, never mid-change.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ftd.agent.local_api import LocalApi
from ftd.agent.spool import Outbox
from ftd.agent.supervision import WatcherSupervisor
from ftd.agent.watchdog import AgentWatchdog
from ftd.agent.watchers.base import Watcher, WatcherHealth, health_of
from ftd.agent.watchers.cloud import CloudWatcher
from ftd.agent.watchers.kmsg import KmsgWatcher
from ftd.bus.base import Bus
from ftd.config.schema import AgentMetricsConfig
from ftd.logs import get_logger

log = get_logger(__name__)


class Agent(Protocol):
    """What the collector reads of the running agent (:class:`ftd.agent.app.Agent`): its parts and
    its watchdog."""

    bus: Bus
    outbox: Outbox
    kmsg: KmsgWatcher
    watchers: list[Watcher]
    supervisor: WatcherSupervisor
    local_api: LocalApi
    watchdog: AgentWatchdog

    @property
    def events_by_kind(self) -> dict[str, int]: ...


class AgentCollector:
    """Reads the agent's outbox, kernel-log watcher, watchers and event counts at scrape time."""

    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    def collect(self) -> Iterator[Metric]:
        a = self._agent
        outbox = a.outbox
        yield GaugeMetricFamily(
            "ftd_agent_bus_connected",
            "1 while the agent is connected to the MQTT broker.",
            value=1 if a.bus.connected else 0,
        )
        yield GaugeMetricFamily(
            "ftd_agent_spool_entries",
            "Messages held: queued, or sent and waiting for the coordinator's receipt.",
            value=len(outbox),
        )
        yield GaugeMetricFamily(
            "ftd_agent_spool_oldest_age_seconds",
            "Seconds the oldest held message has been waiting (0: none).",
            value=outbox.oldest_age(time.monotonic()),
        )
        yield CounterMetricFamily(
            "ftd_agent_spool_dropped", "Messages dropped because the outbox was full.", value=outbox.dropped
        )
        yield GaugeMetricFamily(
            "ftd_agent_spool_available",
            "0 while the spool file cannot be written (the agent holds messages in memory only).",
            value=0 if outbox.spool_error else 1,
        )
        kmsg = a.kmsg
        yield CounterMetricFamily("ftd_agent_kmsg_lines", "Kernel log lines/records read.", value=kmsg.lines)
        yield GaugeMetricFamily(
            "ftd_agent_kmsg_lag_seconds",
            "How late the newest /dev/kmsg record was when the agent read it.",
            value=kmsg.lag_s,
        )
        yield CounterMetricFamily(
            "ftd_agent_kmsg_overruns",
            "/dev/kmsg records overwritten before they were read.",
            value=kmsg.overruns,
        )
        up = GaugeMetricFamily(
            "ftd_agent_watcher_up", "1 while the watcher runs and can watch.", labels=["watcher"]
        )
        states = GaugeMetricFamily(
            "ftd_agent_watcher_state",
            "1 for the watcher's state (running, idle: nothing to watch, unavailable, down) and why.",
            labels=["watcher", "state", "reason"],
        )
        restarts = CounterMetricFamily(
            "ftd_agent_watcher_restarts", "Watcher restarts after a crash or a stall.", labels=["watcher"]
        )
        for watcher in a.watchers:
            running = a.supervisor.running(watcher.name)
            health = health_of(watcher) if running else WatcherHealth("down", "its task is not running")
            up.add_metric([watcher.name], 1 if health.state in ("running", "idle") else 0)
            states.add_metric([watcher.name, health.state, health.reason[:200]], 1)
            restarts.add_metric([watcher.name], a.supervisor.restarts.get(watcher.name, 0))
        yield up
        yield states
        yield restarts
        yield from _cloud_metrics([w for w in a.watchers if isinstance(w, CloudWatcher)])
        events = CounterMetricFamily(
            "ftd_agent_events", "Events published, by kind (after storm control).", labels=["kind"]
        )
        for kind, n in sorted(a.events_by_kind.items()):
            events.add_metric([kind], n)
        yield events
        # The jobs' rank supervisors here (ftd run, issue #24): a spare that is not idle, or a lost
        # one, is what an operator looks for.
        supervisors = GaugeMetricFamily(
            "ftd_agent_supervisors",
            "Rank supervisors (ftd run) of the jobs on this node, by role and state.",
            labels=["role", "state"],
        )
        by_state = Counter((info.role, info.state) for info in a.local_api.supervisors().values())
        for (role, state), n in sorted(by_state.items()):
            supervisors.add_metric([role, state], n)
        yield supervisors
        yield CounterMetricFamily(
            "ftd_agent_supervisors_lost",
            "Rank supervisors whose connection closed without their goodbye (killed, crashed).",
            value=a.local_api.counters["supervisors_lost"],
        )
        # The watchdog's counts (issue #31). While the loop is blocked nothing answers /metrics at all
        # (Prometheus sees the target down); these say afterwards that it happened, and for how long.
        wd = a.watchdog.stats
        yield CounterMetricFamily(
            "ftd_agent_loop_stalls",
            "Stalls of the agent's event loop seen by its watchdog thread.",
            value=wd.loop_stalls,
        )
        yield GaugeMetricFamily(
            "ftd_agent_loop_stall_longest_seconds",
            "The longest event-loop stall seen (0: none).",
            value=wd.longest_loop_stall_s,
        )
        yield CounterMetricFamily(
            "ftd_agent_kmsg_stalls",
            "Stalls of the kernel-log reader: no progress while input waited.",
            value=wd.kmsg_stalls,
        )
        yield CounterMetricFamily(
            "ftd_agent_watchdog_pings", "WATCHDOG=1 notifications sent to systemd.", value=wd.pings
        )


def _cloud_metrics(watchers: list[CloudWatcher]) -> Iterator[Metric]:
    """The cloud-notice watcher's polls, errors by reason and notices (issue #37)."""
    polls = CounterMetricFamily(
        "ftd_agent_cloud_polls", "Metadata-server requests for interruption notices.", labels=["provider"]
    )
    errors = CounterMetricFamily(
        "ftd_agent_cloud_errors",
        "Metadata-server polls that failed or gave a refused notice, by reason.",
        labels=["provider", "reason"],
    )
    notices = CounterMetricFamily(
        "ftd_agent_cloud_notices", "Interruption notices published, by source.", labels=["source"]
    )
    for watcher in watchers:
        for provider, n in sorted(watcher.counts.polls.items()):
            polls.add_metric([provider], n)
        for (provider, reason), n in sorted(watcher.counts.errors.items()):
            errors.add_metric([provider, reason], n)
        for source, n in sorted(watcher.counts.notices.items()):
            notices.add_metric([source], n)
    yield polls
    yield errors
    yield notices


class MetricsServer:
    """``GET /metrics`` on ``agent.metrics.host:port`` (aiohttp, in the agent's loop)."""

    def __init__(self, agent: Agent, cfg: AgentMetricsConfig) -> None:
        self.cfg = cfg
        self.registry = CollectorRegistry()  # no describe at registration: the agent is not built yet
        self.registry.register(AgentCollector(agent))
        self._runner: web.AppRunner | None = None

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.cfg.host, self.cfg.port)
        await site.start()
        log.info("agent_metrics_listening", url=f"http://{self.cfg.host}:{self.cfg.port}/metrics")

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
