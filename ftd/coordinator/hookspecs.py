"""The plugin contract (pluggy, project name ``ftd``): every hook a rule plugin may implement.

Plugins implement hooks with ``@ftd.coordinator.hookspecs.hookimpl``; they are found on the ``ftd``
entry-point group and in the built-in rules package. The engine calls **each implementation on its
own** (not pluggy's all-at-once call): one plugin that raises is logged, recorded and skipped while
the others still decide. Unknown hooks in a plugin fail at start-up (``check_pending``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from ftd.coordinator.model import ActionRecord, ActionRequest
    from ftd.coordinator.state import ClusterView
    from ftd.events import Event

PROJECT = "ftd"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

Executor = Callable[["ActionRecord"], Awaitable[dict[str, Any]]]


@hookspec
def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest] | None:
    """Decide what, if anything, should happen because of ``event``.

    Called: once per new (deduplicated) event, in the coordinator's event loop.
    Arguments: the event and a read-only view of the cluster (nodes, jobs and where they run).
    Result: a list of :class:`~ftd.coordinator.model.ActionRequest` (or None / [] for nothing).
    Rules: pure and fast — no I/O, no sleeping, no mutation of ``view``; the engine, not the
    rule, applies the policy gate (dedupe, cooldown, dry-run) and runs the actions.
    """


@hookspec
def ftd_register_actions() -> Mapping[str, Executor] | None:
    """Offer executors for action kinds, as ``{kind: async callable(record) -> detail dict}``.

    Called: once at start-up, after the built-in executors are registered.
    Result: a mapping; a kind that is already registered is an error reported at start-up.
    The executor must be idempotent: a restarted coordinator may run an unfinished action again.
    """
