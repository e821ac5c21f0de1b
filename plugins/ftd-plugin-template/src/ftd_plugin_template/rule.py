"""Drain a node whose InfiniBand link went down three times within ten minutes.

The contract (ftd/plugin/hookspecs.py):

- ``ftd_evaluate(event, view)`` is called once per new event. Return ``ActionRequest`` values (or
  None). Be pure and fast: no I/O, no sleeping, no clock — time is ``event.ts``. The coordinator's
  policy gate (dedupe, cooldown, rate limits, drain budgets, dry-run, approval) decides whether the
  action runs; you only propose.
- ``view`` is read-only: ``view.jobs_on_node(node)``, ``view.job_nodes(job)``, ``view.node(name)``,
  ``view.gpu(uuid)``, ``view.node_history(node)`` (past faults, severity >= error).
- A rule that raises is logged and skipped; the other rules still decide.
- A rule that needs what the operator configured declares a third argument, ``settings``
  (``ftd.plugin.RuleSettings``, frozen, built from the coordinator's config); this one does not.

History across events belongs in the view when the coordinator keeps it (``node_history``). Here we
keep a small sliding window in the module instead: allowed, because it depends only on the events
seen (the same replay gives the same answer), but it starts empty after a restart.
"""

from __future__ import annotations

from collections import deque

from ftd.plugin import ActionKind, ActionRequest, ClusterView, Event, Kind, hookimpl

FLAPS = 3
WINDOW_S = 600.0

_downs: dict[str, deque[float]] = {}


def reset() -> None:
    """Forget the windows (tests)."""
    _downs.clear()


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest] | None:
    if event.kind != Kind.IB_LINK or event.data.get("state") != "down":
        return None
    window = _downs.setdefault(event.node, deque())
    window.append(event.ts)
    while window and window[0] <= event.ts - WINDOW_S:
        window.popleft()
    if len(window) < FLAPS:
        return None
    window.clear()
    reason = f"infiniband link flapped {FLAPS} times in {WINDOW_S:.0f}s"
    restarts = [
        ActionRequest(
            kind=ActionKind.CHECKPOINT_RESTART,
            target=job,
            reason=f"{reason} on {event.node}",
            params={"exclude": [event.node]},
        )
        for job in view.jobs_on_node(event.node)
    ]
    drain = ActionRequest(kind=ActionKind.DRAIN_NODE, target=event.node, reason=reason)
    return [*restarts, drain]
