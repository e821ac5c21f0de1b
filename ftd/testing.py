"""Helpers for rule authors: unit-test a rule in five lines, no coordinator, no bus.

::

    from ftd.testing import evaluate_rule, make_event, view_with
    import my_rules

    def test_drains_on_second_dbe():
        view = view_with(jobs={"1001": ["node-1", "node-2"]})
        events = [make_event("node-1", "xid", severity="error", data={"code": 48}, ts=t) for t in (0, 60)]
        actions = evaluate_rule(my_rules, events, view)
        assert [(a.kind, a.target) for a in actions] == [("drain_node", "node-1")]

:func:`view_with` builds a real :class:`~ftd.coordinator.model.state.ClusterState` (so a rule sees exactly
the view the coordinator gives it: nodes, jobs, GPUs by UUID, fault history). :func:`evaluate_rule`
calls the rule's ``ftd_evaluate`` the way the engine does (one event at a time, then folds the event
into the view's history) and returns every request, with ``rule`` and ``event_id`` filled in. A rule
that raises makes it raise (:class:`RuleFailed`): in a test, a failure should be loud.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import ModuleType

import pluggy

from ftd.coordinator.decide.plugins import evaluate
from ftd.coordinator.model.state import ClusterState
from ftd.events import Event, JobPresence, Kind, RankInfo, Severity, make_event
from ftd.plugin import hookspecs
from ftd.plugin.actions import ActionKind, ActionRequest
from ftd.plugin.settings import RuleSettings
from ftd.plugin.view import ClusterView

__all__ = [
    "ActionKind",
    "ActionRequest",
    "ClusterView",
    "FakeView",
    "Kind",
    "RuleFailed",
    "Severity",
    "evaluate_rule",
    "make_event",
    "view_with",
]

FakeView = ClusterState  # a real state object, filled by view_with(): the view rules get in production


class RuleFailed(AssertionError):
    """The rule raised or returned something that is not an ActionRequest."""


def view_with(
    *,
    jobs: Mapping[str, Iterable[str]] | None = None,
    nodes: Iterable[str] | Mapping[str, bool] | None = None,
    offline: Iterable[str] = (),
    drained: Iterable[str] = (),
    history: Iterable[Event] = (),
) -> ClusterState:
    """A cluster view: ``jobs`` maps a job id to its nodes (one rank per node, numbered in order);
    ``nodes`` lists extra nodes (or maps node -> online); every node is online unless in ``offline``;
    ``drained`` nodes are marked drained by ftd; ``history`` events are folded in as past events."""
    state = ClusterState()
    node_states: dict[str, bool] = {}
    if isinstance(nodes, Mapping):
        node_states.update({str(n): bool(up) for n, up in nodes.items()})
    elif nodes is not None:
        node_states.update({str(n): True for n in nodes})
    for job, job_nodes in (jobs or {}).items():
        for rank, node in enumerate(job_nodes):
            state.apply_presence(node, job, JobPresence(job=job, node=node, ranks=[RankInfo(rank=rank)]))
            node_states.setdefault(node, True)
    for node in offline:
        node_states[node] = False
    for node, up in node_states.items():
        record = state._node(node)
        record.online = up
    for node in drained:
        state.mark_drained(node, "drained before the test")
    for event in history:
        state.apply_event(event)
    return state


def evaluate_rule(
    rule: ModuleType | object,
    events: Event | Iterable[Event],
    view: ClusterView | None = None,
    *,
    settings: RuleSettings | None = None,
) -> list[ActionRequest]:
    """Every action request ``rule`` makes for ``events`` (in order), as the engine would see them;
    ``settings`` is what the configuration says to rules (the defaults when not given)."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    name = getattr(rule, "plugin_name", None)
    if name is None and isinstance(rule, ModuleType):
        name = rule.__name__.rsplit(".", 1)[-1]
    pm.register(rule, name=name if isinstance(name, str) else None)
    pm.check_pending()
    state = view if view is not None else view_with()
    out: list[ActionRequest] = []
    for event in [events] if isinstance(events, Event) else list(events):
        result = evaluate(pm, event, state, settings or RuleSettings(), slow_s=float("inf"))
        if result.errors:
            raise RuleFailed("; ".join(f"{rule_name}: {error}" for rule_name, error in result.errors))
        out.extend(result.requests)
        apply = getattr(state, "apply_event", None)
        if callable(apply):
            apply(event)
    return out
