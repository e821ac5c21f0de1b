"""Drills are marked on everything they cause: what a rule asks for on a drill's event says so.

What: :func:`is_drill` (an event ``ftd inject`` sent: ``source = "inject"`` or ``data.drill``) and
:func:`marked` (a rule's request for it with its reason starting ``drill:`` and ``params.drill =
true``). The engine marks every request it gets for a drill's event, so the ledger, ``ftd status``,
the dashboard, the scheduler's drain reason and every notification show that the fault was
rehearsed, while the request is otherwise what the real fault gets (issue #32: drills take the real
path).
"""

from __future__ import annotations

import msgspec

from ftd.events import Event
from ftd.plugin.actions import ActionRequest

__all__ = ["PREFIX", "is_drill", "marked"]

PREFIX = "drill: "
INJECT = "inject"


def is_drill(event: Event) -> bool:
    return event.source == INJECT or event.data.get("drill") is True


def marked(request: ActionRequest) -> ActionRequest:
    """``request`` as a drill's: reason prefixed, ``params.drill`` set (idempotent)."""
    reason = request.reason if request.reason.startswith(PREFIX) else PREFIX + request.reason
    return msgspec.structs.replace(request, reason=reason, params={**request.params, "drill": True})
