"""The rule contract: the one import a rule author needs.

::

    from ftd.plugin import ActionKind, ActionRequest, ClusterView, Event, Kind, hookimpl

    @hookimpl
    def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest]:
        if event.kind == Kind.XID and event.data.get("code") == 79:
            return [ActionRequest(kind=ActionKind.DRAIN_NODE, target=event.node, reason="xid 79")]
        return []

What is here and why it is on a floor of its own: the hook specifications (:mod:`.hookspecs`), the
action model rules return and the ledger records (:mod:`.actions`), the read-only cluster view
(:mod:`.view`), the typed settings the engine hands rules (:mod:`.settings`), the wire types of
events (re-exported from :mod:`ftd.events`) and small pure helpers
the built-in rules share (:mod:`.helpers`). Rules — the built-in ones in :mod:`ftd.rules`, an
operator's files in ``coordinator.rule_dirs``, installed plugins — import this package and nothing
of the coordinator, so the coordinator can change without breaking them and a rule cannot reach
the coordinator's I/O. ``tests/unit/test_layering.py`` holds that line.
"""

from __future__ import annotations

from ftd.events import Event, Kind, Severity, make_event
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState
from ftd.plugin.hookspecs import PROJECT, Executor, hookimpl, hookspec
from ftd.plugin.settings import AppFaultPolicy, RuleSettings
from ftd.plugin.view import ClusterView, FaultRecord, GpuRecord, JobRecord, NodeRecord, fault_of

__all__ = [
    "PROJECT",
    "ActionKind",
    "ActionRecord",
    "ActionRequest",
    "ActionState",
    "AppFaultPolicy",
    "ClusterView",
    "Event",
    "Executor",
    "FaultRecord",
    "GpuRecord",
    "JobRecord",
    "Kind",
    "NodeRecord",
    "RuleSettings",
    "Severity",
    "fault_of",
    "hookimpl",
    "hookspec",
    "make_event",
]
