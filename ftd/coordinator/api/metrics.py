"""Prometheus metrics of the coordinator, read from its live state at scrape time.

No double bookkeeping: the collector reads the engine's counters and its running and held actions,
intake's refusals, the cluster state, the policy gate's drain budget and the HA status when it is
scraped. The one thing kept here is ``ftd_actions_finished_total``: seeded from the ledger when the
API starts (:meth:`ActionTotals.load`: every finished action it holds, by kind and outcome), then
counted as the engine reports each action's end, so the totals survive a coordinator restart and
``increase()`` over them is right.

The names an operator alerts on (deploy/prometheus/ftd-alerts.yml):

======================================  ==========================================================
``ftd_bus_connected``                    1 while the coordinator's MQTT connection is up
``ftd_last_event_timestamp_seconds``     wall clock of the last event recorded (0: none yet)
``ftd_start_timestamp_seconds``          wall clock this coordinator (its term, with HA) started: the
                                         silence alert counts from it while no event has come
``ftd_actions{kind,state}``              actions now pending, running or awaiting approval
``ftd_actions_awaiting_approval``        actions held for a human
``ftd_actions_stuck``                    running past their kind's deadline (``model.deadlines``)
``ftd_actions_finished_total{kind,state}`` actions ended, by outcome (survives restarts)
``ftd_nodes{state}``                     nodes by exclusive state: drained (by ftd) > unavailable
                                         (drained/down by others) > offline > online
``ftd_node_conditions{kind,severity,drill}``  active conditions the agents report, by event kind
                                         (``drill`` "true": raised by ``ftd inject``)
``ftd_drain_budget`` / ``ftd_drain_budget_used``  how many nodes ftd may hold drained, and holds
======================================  ==========================================================

Label values are bounded: kinds are ftd's closed sets (an unknown kind from an agent is ``other``),
states the action states.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ftd.coordinator.model.checkpoints import LEVELS as CHECKPOINT_LEVELS
from ftd.coordinator.model.deadlines import stuck_after_s
from ftd.events import Kind
from ftd.logs import get_logger
from ftd.plugin.actions import ActionRecord, ActionState

if TYPE_CHECKING:
    from ftd.coordinator.daemon import Coordinator

log = get_logger(__name__)

DRILL_SUFFIX = " (drill)"  # how the agent's condition reason marks a drill's (ftd.agent.conditions)

_KINDS = frozenset(k.value for k in Kind)
_FINISHED = frozenset(s.value for s in ActionState if s.finished)
_NODE_STATES = ("online", "offline", "drained", "unavailable")


class ActionTotals:
    """Actions ended, by (kind, outcome): seeded from the ledger, then counted as they end."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}
        self._seen: set[str] = set()  # ids counted since start (an end reported twice counts once)

    async def load(self, coordinator: Coordinator) -> None:
        """Start from what the ledger holds (before the engine reports anything new)."""
        held = await coordinator.ledger.action_counts()
        for (kind, state), n in held.items():
            if state in _FINISHED:
                self.counts[(kind, state)] = self.counts.get((kind, state), 0) + n

    def ended(self, record: ActionRecord) -> None:
        if not record.state.finished or record.id in self._seen:
            return
        self._seen.add(record.id)
        if len(self._seen) > 100_000:  # bounded memory; an id is reported ended once in practice
            self._seen.clear()
        key = (record.request.kind, str(record.state))
        self.counts[key] = self.counts.get(key, 0) + 1


class MetricsCollector:
    """Reads the coordinator's live state at scrape time (no double bookkeeping)."""

    def __init__(self, coordinator: Coordinator, totals: ActionTotals) -> None:
        self._coordinator = coordinator
        self._totals = totals

    def collect(self) -> Iterator[Metric]:
        c = self._coordinator
        counters = c.engine.counters
        for name, key, text in (
            ("ftd_events_received", "events", "Events received and evaluated (duplicates excluded)."),
            ("ftd_events_duplicate", "duplicates", "Events dropped as duplicates (id already in ledger)."),
            ("ftd_rule_errors", "rule_errors", "Rule calls that raised."),
        ):
            yield CounterMetricFamily(name, text, value=counters.get(key, 0))
        yield CounterMetricFamily(
            "ftd_bad_messages", "Bus messages that failed to decode or validate.", value=c.bad_messages
        )
        yield GaugeMetricFamily(
            "ftd_bus_connected",
            "1 while the coordinator is connected to the MQTT broker.",
            value=1 if c.bus.connected else 0,
        )
        yield GaugeMetricFamily(
            "ftd_last_event_timestamp_seconds",
            "Wall clock (Unix seconds) of the last event recorded; 0 when none since start.",
            value=c.engine.last_event_at,
        )
        yield GaugeMetricFamily(
            "ftd_start_timestamp_seconds",
            "Wall clock (Unix seconds) this coordinator started recording events.",
            value=c.engine.started_at,
        )
        yield from self._actions(c)
        yield from self._nodes(c)
        yield GaugeMetricFamily(
            "ftd_jobs", "Jobs with ranks registered at an agent.", value=len(c.state.jobs)
        )
        yield from self._checkpoints(c)
        if c.ha is not None:  # active/standby (ftd.coordinator.ha.runner): leader, epoch, lease age
            yield from c.ha.metrics()

    def _actions(self, c: Coordinator) -> Iterator[Metric]:
        active = c.engine.active()
        now_by: dict[tuple[str, str], int] = {}
        now = time.time()
        stuck = 0
        for record in active:
            key = (record.request.kind, str(record.state))
            now_by[key] = now_by.get(key, 0) + 1
            if (
                record.state == ActionState.RUNNING
                and record.created
                and (now - record.created > stuck_after_s(record.request.kind, c.config.coordinator))
            ):
                stuck += 1
        gauge = GaugeMetricFamily(
            "ftd_actions", "Actions now pending, running or awaiting approval.", labels=["kind", "state"]
        )
        for (kind, state), n in sorted(now_by.items()):
            gauge.add_metric([kind, state], n)
        yield gauge
        yield GaugeMetricFamily(
            "ftd_actions_awaiting_approval",
            "Actions held for a human's approval.",
            value=len(c.engine.awaiting),
        )
        yield GaugeMetricFamily(
            "ftd_actions_stuck",
            "Actions running longer than their kind's deadlines allow (ftd.coordinator.model.deadlines).",
            value=stuck,
        )
        finished = CounterMetricFamily(
            "ftd_actions_finished",
            "Actions ended, by kind and outcome (seeded from the ledger: survives restarts).",
            labels=["kind", "state"],
        )
        for (kind, state), n in sorted(self._totals.counts.items()):
            finished.add_metric([kind, state], n)
        yield finished

    def _checkpoints(self, c: Coordinator) -> Iterator[Metric]:
        """Each running job's newest verified checkpoint per level (issue #34), and the limit. The
        training job is the label ``job_id``: ``job`` is Prometheus's own (the scrape job)."""
        now = time.time()
        catalogue = c.state.checkpoints
        age = GaugeMetricFamily(
            "ftd_job_checkpoint_age_seconds",
            "Seconds since the job's newest checkpoint verified on every rank at this level was "
            "complete (jobs that report their checkpoints only).",
            labels=["job_id", "level"],
        )
        save = GaugeMetricFamily(
            "ftd_job_checkpoint_save_seconds",
            "How long the job's newest reported save took (the slowest rank's own measure).",
            labels=["job_id"],
        )
        for job in catalogue.jobs():
            if job not in c.state.jobs:
                continue
            for level in CHECKPOINT_LEVELS:
                newest = catalogue.newest_verified(job, level)
                if newest is not None:
                    age.add_metric([job, level], max(0.0, now - newest[1]))
            seconds = catalogue.save_seconds(job)
            if seconds is not None:
                save.add_metric([job], seconds)
        yield age
        yield save
        yield GaugeMetricFamily(
            "ftd_checkpoint_age_limit_seconds",
            "coordinator.checkpoint_age_limit_s: how old a job's newest verified checkpoint may grow.",
            value=c.config.coordinator.checkpoint_age_limit_s,
        )

    def _drift(self, c: Coordinator) -> Iterator[Metric]:
        """Version drift (issue #36): the drifted nodes per field, and the nodes not judged."""
        book = c.state.inventory
        per_field: dict[str, int] = {}
        for report in book.drifted().values():
            for name in report.fields:
                per_field[name] = per_field.get(name, 0) + 1
        gauge = GaugeMetricFamily(
            "ftd_nodes_drifted",
            "Nodes whose version differs from their hardware profile's peers or is below its minimum, by "
            "field (a node drifting on two fields counts in both).",
            labels=["field"],
        )
        for name, n in sorted(per_field.items()):
            gauge.add_metric([name], n)
        yield gauge
        yield GaugeMetricFamily(
            "ftd_nodes_drift_unchecked",
            "Nodes that reported an inventory but could not be judged for drift (no hardware profile).",
            value=book.unchecked(),
        )

    def _nodes(self, c: Coordinator) -> Iterator[Metric]:
        by_state = dict.fromkeys(_NODE_STATES, 0)
        for node in c.state.nodes.values():
            if node.drained_by_ftd:
                by_state["drained"] += 1
            elif node.name in c.state.unavailable:
                by_state["unavailable"] += 1
            else:
                by_state["online" if node.online else "offline"] += 1
        # drained or down by others, not (yet) seen on the bus
        by_state["unavailable"] += sum(1 for name in c.state.unavailable if name not in c.state.nodes)
        gauge = GaugeMetricFamily(
            "ftd_nodes",
            "Nodes by exclusive state: drained (by ftd), unavailable (drained or down by others), "
            "offline, online.",
            labels=["state"],
        )
        for state in _NODE_STATES:
            gauge.add_metric([state], by_state[state])
        yield gauge
        conditions: dict[tuple[str, str, str], int] = {}
        for node_name, kinds in c.state.condition_kinds.items():
            reasons = c.state.conditions.get(node_name, [])
            for kind, reason in zip(kinds, reasons, strict=False):
                label = kind if kind in _KINDS or kind == "unknown" else "other"
                # the agent keeps critical events as conditions, and a watcher that cannot watch
                # (agent_health, an error: issue #32); a drill's reason ends with "(drill)"
                severity = "error" if kind == Kind.AGENT_HEALTH else "critical"
                drill = "true" if reason.endswith(DRILL_SUFFIX) else "false"
                key = (label, severity, drill)
                conditions[key] = conditions.get(key, 0) + 1
        gauge = GaugeMetricFamily(
            "ftd_node_conditions",
            "Active conditions the agents report, by event kind ('unknown': an older agent), severity "
            "and whether a drill (ftd inject) raised them.",
            labels=["kind", "severity", "drill"],
        )
        for (kind, severity, drill), n in sorted(conditions.items()):
            gauge.add_metric([kind, severity, drill], n)
        yield gauge
        yield from self._drift(c)
        gate = c.engine.gate
        yield GaugeMetricFamily(
            "ftd_drain_budget",
            "How many nodes ftd may hold drained now (policy.max_drained_fraction of the nodes known).",
            value=gate.drain_budget(len(c.state.nodes)),
        )
        yield GaugeMetricFamily(
            "ftd_drain_budget_used",
            "Nodes ftd holds drained or is draining (counted against the budget).",
            value=len(gate.drained_set(c.state)),
        )
