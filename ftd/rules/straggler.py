"""Stragglers: a rank far behind its peers slows the whole job; a human should look.

====================  ==========================================================================
event                 actions
====================  ==========================================================================
``rank_straggler``    notify (target the node; params ``job``, ``rank``, ``lag_steps`` when the
                      event carries them) — no restart: a slow rank is not a failed one
====================  ==========================================================================
"""

from __future__ import annotations

from typing import Any

from ftd.plugin import ActionRequest, ClusterView, Event, Kind, hookimpl
from ftd.plugin.helpers import notify

#: The only kinds this rule decides on (the coordinator skips it for the others).
EVENT_KINDS = frozenset({Kind.RANK_STRAGGLER})


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest] | None:
    if event.kind != Kind.RANK_STRAGGLER:
        return None
    keys = ("job", "rank", "lag_steps", "step")
    params: dict[str, Any] = {k: event.data[k] for k in keys if k in event.data}
    who = f"rank {params['rank']} of job {params.get('job', '?')}" if "rank" in params else "a rank"
    lag = f", {params['lag_steps']} steps behind" if "lag_steps" in params else ""
    return [notify(event, f"straggler: {who} on {event.node}{lag}", params)]
