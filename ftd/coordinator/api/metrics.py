"""Prometheus metrics of the coordinator, read from its live counters at scrape time.

No double bookkeeping: the collector reads the engine's counters, intake's refusals, the cluster
state and the HA status when it is scraped; only action transitions are counted here, as the engine
reports them to the API.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ftd.logs import get_logger

if TYPE_CHECKING:
    from ftd.coordinator.daemon import Coordinator

log = get_logger(__name__)
T = TypeVar("T")

# --------------------------------------------------------------------------------------------------
# Metrics


class MetricsCollector:
    """Reads the coordinator's live counters at scrape time (no double bookkeeping)."""

    def __init__(self, coordinator: Coordinator, action_transitions: dict[tuple[str, str], int]) -> None:
        self._coordinator = coordinator
        self._transitions = action_transitions  # (kind, state) -> count, kept by the API's observer

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
        actions = CounterMetricFamily(
            "ftd_actions",
            "Action state transitions seen by this process, by kind and state.",
            labels=["kind", "state"],
        )
        for (kind, state), count in sorted(self._transitions.items()):
            actions.add_metric([kind, state], count)
        yield actions
        nodes = c.state.nodes.values()
        gauge = GaugeMetricFamily("ftd_nodes", "Nodes known to the coordinator, by state.", labels=["state"])
        gauge.add_metric(["online"], sum(1 for n in nodes if n.online))
        gauge.add_metric(["offline"], sum(1 for n in nodes if not n.online))
        gauge.add_metric(["drained"], sum(1 for n in nodes if n.drained_by_ftd))
        gauge.add_metric(["unavailable"], len(c.state.unavailable))  # drained/down by others
        yield gauge
        yield GaugeMetricFamily(
            "ftd_jobs", "Jobs with ranks registered at an agent.", value=len(c.state.jobs)
        )
        if c.ha is not None:  # active/standby (ftd.coordinator.ha.runner): leader, epoch, lease age
            yield from c.ha.metrics()
